"""Checkpoints survive a crash mid-write: a process writing them in a loop is SIGKILLed at random moments, and every
checkpoint the run would resume from loads completely (weights, optimizer state, iteration)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from earl_core.checkpoints import STATE_FILE, complete_checkpoints

WRITER = """
import sys
from pathlib import Path
from earl_core.config import AlgoConfig
from earl_core.rl.learner import Learner

model_dir, run_dir, start = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
learner = Learner(model_dir, algo=AlgoConfig(), seed=0)
print("ready", flush=True)
for i in range(start, start + 10_000):
    # every other save rewrites the previous iteration's folder: the replace path is crashed into too
    it = i // 2
    learner.save(run_dir / "checkpoints" / f"iter_{it:06d}", extra={"iteration": it})
"""


def test_a_crash_mid_write_never_leaves_a_checkpoint_that_loads_wrong(protocol_model: Path, tmp_path: Path) -> None:
    rng = random.Random(0)
    start = 0
    for attempt in range(4):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(protocol_model), str(tmp_path), str(start)],
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.3, 1.5))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
        found = complete_checkpoints(tmp_path)
        assert found, f"attempt {attempt}: no complete checkpoint after {time.time()}"
        for iteration, folder in found:
            assert json.loads((folder / STATE_FILE).read_text()) == {"iteration": iteration}
            state = torch.load(folder / "trainer_state.pt", weights_only=False)
            assert "optimizer" in state
            AutoModelForCausalLM.from_pretrained(folder)  # every weight file present and whole
        start = (found[-1][0] + 1) * 2
    # What a crash left half-written is there but never counted.
    leftovers = {p.name.split(".", 1)[1] for p in (tmp_path / "checkpoints").iterdir() if "." in p.name}
    assert leftovers <= {"tmp", "old"}
