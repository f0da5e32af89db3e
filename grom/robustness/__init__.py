"""Is it really gone? Attacks on an edit's forgetting: held-out probe questions and their
transformations (`probes`), questions written to reach the same facts through another
entity or under another name (`written`: multi_hop, alias), attacks on the weights (`weights`: relearning, quantization,
the logit lens), each scored by fact recall before and after the edit (`result`), and
membership inference (`membership`: AUCs), run together by `suite.run_attacks`; the
relearning attack's lr per model, and its measurement, in `calibration`."""
from grom.robustness.calibration import calibrate_relearn_lr, relearn_lr
from grom.robustness.probes import PROBE_TYPES, probes_from_examples, transform
from grom.robustness.result import AttackResult, Probe, Recall, probe_recall
from grom.robustness.suite import ATTACKS, attack_names, run_attacks

__all__ = ["ATTACKS", "AttackResult", "PROBE_TYPES", "Probe", "Recall", "attack_names", "calibrate_relearn_lr",
           "probe_recall", "probes_from_examples", "relearn_lr", "run_attacks", "transform"]
