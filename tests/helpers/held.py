"""Training processes held at a step (``step_hold/sitecustomize.py``), so that a signal sent from
outside lands there, never "soon after a line was read": a run read at step 30 of 80 once finished
before the Ctrl-C arrived on a loaded machine.

    hold = StepHold(tmp_path / "hold", 5)
    proc = subprocess.Popen(args, env={**os.environ, **hold.env()})
    (pid,) = hold.wait()      # the process waits at step 5
    os.kill(pid, signal.SIGUSR2)
    hold.release()            # it goes on: saves, exits 75 at step 5

Every process that trains under ``hold.env()`` holds: the command itself, a launched job (the env
travels with it), each process of a torchrun.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

HOOK = Path(__file__).parent / "step_hold"


class StepHold:
    def __init__(self, folder: Path, step: int) -> None:
        self.folder, self.step = folder, step
        folder.mkdir(parents=True, exist_ok=True)

    def env(self) -> dict[str, str]:
        """What a process needs in its environment to hold (PYTHONPATH: the hook first)."""
        path = os.pathsep.join(p for p in (str(HOOK), os.environ.get("PYTHONPATH", "")) if p)
        return {"PYTHONPATH": path, "DIFFSWEEP_TEST_HOLD": f"{self.step}:{self.folder}"}

    def held(self) -> list[int]:
        """The pids of the processes that reached the hold so far."""
        return sorted(int(p.name.removeprefix("held-")) for p in self.folder.glob("held-*"))

    def wait(self, processes: int = 1, *, alive: list | None = None, timeout: float = 600) -> list[int]:
        """The pids of ``processes`` processes once they all wait at the step. ``alive``: Popen
        objects whose end before that fails at once (with what they printed, if piped); the timeout
        only ends a hang."""
        deadline = time.monotonic() + timeout
        while len(pids := self.held()) < processes:
            for proc in alive or ():
                if proc.poll() is not None:
                    out, err = proc.communicate()
                    raise AssertionError(f"{proc.args[:4]} ended (exit {proc.returncode}) before step {self.step}:"
                                         f"\n{out or ''}{err or ''}"[-4000:])
            assert time.monotonic() < deadline, f"no process reached step {self.step} in {timeout} s"
            time.sleep(0.01)
        return pids

    def signalled(self, pid: int) -> bool:
        """Whether process ``pid``'s preemption handler (SIGUSR2, SIGTERM) has run."""
        return (self.folder / f"signalled-{pid}").exists()

    def release(self, pid: int | None = None) -> None:
        """Let every process go on (from now on, none holds), or only process ``pid``."""
        (self.folder / ("go" if pid is None else f"go-{pid}")).touch()
