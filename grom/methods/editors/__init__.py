"""The locate-then-edit editors: the shared run on GROM's keys and retain covariance
(locate_then_edit.py), the per-fact value optimisation (value_optimisation.py, on the model
from one decoder layer up: layers_above.py), the update rules (update_rules.py), and one
file per editor, each registering its row in the method registry when imported, at the
place in every list of methods its `register_editor` call gives it."""
from grom.methods.editors import alphaedit, memit, rome, zero_unlearn  # noqa: F401
