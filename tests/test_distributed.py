"""Data parallel on torch.distributed (gloo, two processes on this CPU) gives the patch of
one process: `python -m grom edit` run by every rank (as under torchrun), and `run_edit`
on a float64 model, whose update must agree to 1e-10.

The split of the data is the hard case: 4 forget and 6 retain examples in batches of 4
are 3 batches, so rank 0 takes the forget batch and one retain batch, rank 1 one retain
batch and no forget batch; the automatic band's scores are reduced too (-k 2)."""
import json
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from grom import EditConfig, run_edit
from grom.cli import main
from grom.edit import Edit
from tests.conftest import FORGET, RETAIN, make_tokenizer, tiny_llama

CONFIG = EditConfig(k=2, beta=5.0, w_r=10.0, rho=0.05, batch_size=4)


def _cli_args(folder, files, out) -> list[str]:
    return ["edit", "--model", str(folder), "--device", "cpu", "-k", "2", "--beta", "5", "--w-r", "10",
            "--rho", "0.05", "--batch-size", "4", *files, "--out", str(out)]


def _rank(rank: int, port: int, folder, files, out, result) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        torch.set_num_threads(1)
        assert main(_cli_args(folder, files, out)) == 0  # the CLI finds the group already active
        tok = make_tokenizer()
        edit = run_edit(tiny_llama(len(tok)).double(), tok, FORGET, RETAIN, CONFIG)
        torch.save({"patches": edit.patches, "band": edit.band, "world_size": edit.world_size},
                   f"{result}.{rank}")
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_ranks_give_the_one_process_patch(tmp_path):
    tok = make_tokenizer()
    folder = tmp_path / "tiny"
    tiny_llama(len(tok)).save_pretrained(folder, safe_serialization=True)
    tok.save_pretrained(folder)
    for name, rows in (("forget", FORGET), ("retain", RETAIN)):
        (tmp_path / f"{name}.jsonl").write_text(
            "\n".join(json.dumps({"question": e.question, "answer": e.answer}) for e in rows))
    files = ["--forget", str(tmp_path / "forget.jsonl"), "--retain", str(tmp_path / "retain.jsonl")]

    assert main(_cli_args(folder, files, tmp_path / "one")) == 0
    one = Edit.load(tmp_path / "one")
    ref = run_edit(tiny_llama(len(tok)).double(), tok, FORGET, RETAIN, CONFIG)

    mp.spawn(_rank, args=(_free_port(), folder, files, tmp_path / "two", tmp_path / "ranks"), nprocs=2)
    two = Edit.load(tmp_path / "two")
    meta = json.loads((tmp_path / "two" / "edit.json").read_text())
    assert meta["world_size"] == 2 and json.loads((tmp_path / "one" / "edit.json").read_text())["world_size"] == 1
    assert two.band == one.band and two.patches.keys() == one.patches.keys()
    for name, P in one.patches.items():  # float32 patches: within one ulp
        ulp = torch.finfo(P.dtype).eps * P.abs().clamp_min(torch.finfo(P.dtype).tiny)
        assert bool(((two.patches[name] - P).abs() <= ulp).all()), name
    for rank in (0, 1):  # every rank computed the same float64 update
        got = torch.load(tmp_path / f"ranks.{rank}")
        assert got["world_size"] == 2 and got["band"] == ref.band
        for name, P in ref.patches.items():
            assert float((got["patches"][name] - P).norm() / P.norm()) < 1e-10, (rank, name)
