"""AlphaEdit, registered as an editor: MEMIT's update projected onto the null space of the
retain keys (grom.methods.editors.update_rules.alphaedit_update)."""
from grom.methods.editors import update_rules as rules
from grom.methods.editors.locate_then_edit import EditorMethod, register_editor

ALPHAEDIT = register_editor(EditorMethod(
    "alphaedit", "AlphaEdit",
    lambda W, K, R, C0, c: rules.alphaedit_update(K, R, rules.null_space_projector(C0, c.null_threshold), c.l2),
    "MEMIT's edit confined to the null space of the retain keys, so kept inputs are (nearly) "
    "untouched; needs facts with a subject and a retain set."), order=320)
