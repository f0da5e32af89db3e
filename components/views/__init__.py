"""Pure view builders: plotly figures, tables, the word diff and the page's text. They take
data and return views; none reads a session or touches the model."""
