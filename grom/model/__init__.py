"""The model infrastructure every method shares, below them: loading (`loading`, `fetch`,
`sharding`, and `hub`: is the Hub there), where a causal LM keeps its parts (`arch`), what
may be edited in place (`editable`), forward hooks (`hooks`), data parallelism
(`distributed`) and the process's memory (`process_memory`)."""
