"""GROM's method itself: one closed-form ridge solve per edited layer.

A file per step, named after it: `config` (EditConfig and the paper's presets), `keys`
(examples to key positions and keys), `collect` (the forward passes over key batches),
`directions` (D, what each forget key's output should move by), `refusal` (the refusal
target's forget keys), `solve` (Theorem 1), `layer_solver` (one band's layers summed, solved
and applied), `layer_scores` (the logit-lens scores S_l and the band), `influence`
(Theorem 2), `diagnostics` (influence and outputs from an Edit's kept keys), `memory_plan`
(bytes per stage before anything runs) and `pipeline` (`run_edit`, examples to an `Edit`).
"""
