"""Is it really gone? Attacks on an edit's forgetting: held-out probe questions and their
transformations (`probes`), attacks on the weights (`weights`: relearning, quantization,
the logit lens), each scored by fact recall before and after the edit (`result`), and
membership inference (`membership`: AUCs), run together by `suite.run_attacks`."""
from grom.robustness.probes import PROBE_TYPES, probes_from_examples, transform
from grom.robustness.result import AttackResult, Probe, Recall, probe_recall
from grom.robustness.suite import ATTACKS, attack_names, run_attacks

__all__ = ["ATTACKS", "AttackResult", "PROBE_TYPES", "Probe", "Recall", "attack_names", "probe_recall",
           "probes_from_examples", "run_attacks", "transform"]
