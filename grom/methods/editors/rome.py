"""ROME, rank-one model editing, registered as an editor: the rank-one update of the band's
last layer alone (grom.methods.editors.update_rules.rome_update, GROM's ridge on C0)."""
from grom.methods.editors import update_rules as rules
from grom.methods.editors.locate_then_edit import EditorMethod, register_editor

ROME = register_editor(EditorMethod(
    "rome", "ROME", lambda W, K, R, C0, c: rules.rome_update(W, K, R, rules.ridge(C0, c.rho)),
    "Rank-one edit of one MLP layer per fact, mapping the fact's subject key to a value that makes "
    "its answer improbable, weighted by the retain covariance; needs facts with a subject and a "
    "retain set.", spreads=False), order=300)
