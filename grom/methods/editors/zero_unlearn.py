"""ZeroUnlearn, registered as an editor: the multiplicative update that removes the facts'
original outputs from each band layer's range
(grom.methods.editors.update_rules.zerounlearn_update)."""
from grom.methods.editors import update_rules as rules
from grom.methods.editors.locate_then_edit import EditorMethod, register_editor

ZERO_UNLEARN = register_editor(EditorMethod(
    "zerounlearn", "ZeroUnlearn",
    lambda W, K, R, C0, c: rules.zerounlearn_update(W, K, R, C0, w_r=c.w_r, w_f=c.w_f, lam=c.lam, eps=c.eps),
    "Multiplicative edit of each band layer that removes the facts' original outputs from its "
    "range and maps the facts elsewhere; needs facts with a subject and a retain set."), order=330)
