"""MEMIT, registered as an editor: the least-squares update of all facts at once, spread
over the band (grom.methods.editors.update_rules.memit_update)."""
from grom.methods.editors import update_rules as rules
from grom.methods.editors.locate_then_edit import EditorMethod, register_editor

MEMIT = register_editor(EditorMethod(
    "memit", "MEMIT", lambda W, K, R, C0, c: rules.memit_update(K, R, C0, c.w_r, c.rho),
    "Least-squares edit of all facts at once, spread over a band of MLP layers, held to the retain "
    "covariance; needs facts with a subject and a retain set."), order=310)
