"""Get the device kit ready on this (CPU) machine: the wheels the GPU machine lacks, the size budget,
and the one command to run there.

The GPU machine has no network and takes at most 64 MiB of working tree plus carried paths per
command (``shared/notes/GPU_MACHINE.md``). This script

1. downloads ``analysis/gpu/requirements.txt`` and its whole dependency closure as CPython 3.12
   manylinux wheels into ``.whl/`` (git-ignored; ``pip download`` keeps what is already there),
2. checks offline that the folder alone satisfies the requirements for that interpreter
   (``pip install --dry-run --no-index --find-links .whl``),
3. adds up what a command sends (the working tree: tracked and untracked-not-ignored files, plus
   ``.whl/``) against a 64 MiB budget,
4. prints the command to run there and the ignored paths it needs carried.

    python3 analysis/gpu/prepare.py            # download, check, print the command
    python3 analysis/gpu/prepare.py --offline  # check an already prepared .whl/ only
    python3 analysis/gpu/prepare.py --json     # the same as JSON

Standard library only, so it runs with any Python that has pip. Exit 0 when everything fits,
2 with one line when something does not (a missing or incomplete wheel set, the budget).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KIT = Path(__file__).resolve().parent
REQUIREMENTS = KIT / "requirements.txt"
WHEELS = ".whl"  # relative to the repository root, git-ignored
BUDGET_BYTES = 64 * 2**20  # what one device call may send: working tree + carried paths
COMMAND_LIMIT = 2000  # characters of one device command
DEVICE_PYTHON = "3.12"  # the GPU image's interpreter (shared/notes/GPU_MACHINE.md)
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")
# The first command: every stage within 450 s, so that with the machine's start it ends inside
# 8 minutes and a second command still fits in a 15-minute window.
DEVICE_COMMAND = "PYTHONUNBUFFERED=1 python3 analysis/gpu/run.py --out \"$OUT\" --budget 450"
DEVICE_TIMEOUT_S = 500


class KitError(Exception):
    """Something the user can fix; printed as one line, exit 2."""


def _target_flags() -> list[str]:
    flags = ["--only-binary=:all:", "--python-version", DEVICE_PYTHON, "--implementation", "cp"]
    for platform in PLATFORMS:
        flags += ["--platform", platform]
    return flags


def download(wheels: Path) -> None:
    """The requirements and their dependency closure as wheels for the GPU machine's Python."""
    wheels.mkdir(exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", *_target_flags(),
           "-d", str(wheels), "-r", str(REQUIREMENTS)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        detail = [line for line in done.stderr.splitlines() if line.startswith("ERROR")] or done.stderr.splitlines()
        raise KitError(f"{wheels}: pip download failed: {(detail or ['no output'])[-1]}")


def resolve(wheels: Path) -> list[dict]:
    """What pip would install on the GPU machine's Python from ``wheels`` alone (offline): the
    distributions and versions. Raises KitError when the folder does not satisfy the requirements."""
    if not wheels.is_dir() or not any(wheels.glob("*.whl")):
        raise KitError(f"{wheels}: no wheels; run python3 analysis/gpu/prepare.py (without --offline) first")
    with tempfile.TemporaryDirectory() as target:
        cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--disable-pip-version-check",
               "--no-index", "--find-links", str(wheels), "--ignore-installed", "--target", target,
               *_target_flags(), "--report", "-", "-r", str(REQUIREMENTS)]
        done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        errors = [line for line in done.stderr.splitlines() if line.startswith("ERROR")] or ["pip failed"]
        raise KitError(f"{wheels}: does not satisfy {REQUIREMENTS.relative_to(ROOT)} for Python {DEVICE_PYTHON}: "
                       f"{errors[0].removeprefix('ERROR: ')}")
    report = json.loads(done.stdout)
    return [{"name": item["metadata"]["name"], "version": item["metadata"]["version"]} for item in report["install"]]


def sent_files(root: Path) -> list[Path]:
    """What a device call sends of the checkout: tracked and untracked-not-ignored files."""
    listed = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            capture_output=True, text=True, check=True).stdout
    return [root / name for name in dict.fromkeys(listed.split("\0")) if name and (root / name).is_file()]


def _size(paths) -> int:
    return sum(p.stat().st_size for p in paths if p.is_file())


def budget(root: Path, wheels: Path) -> dict:
    tree = _size(sent_files(root))
    carried = _size(wheels.rglob("*")) if wheels.is_dir() else 0
    return {"tree_bytes": tree, "wheels_bytes": carried, "total_bytes": tree + carried, "limit_bytes": BUDGET_BYTES}


def prepare(*, offline: bool = False, root: Path = ROOT) -> dict:
    """Download (unless ``offline``), check the closure and the budget; the kit's facts as data."""
    if subprocess.run(["git", "-C", str(root), "check-ignore", "-q", f"{WHEELS}/x.whl"]).returncode != 0:
        raise KitError(f"{WHEELS}/: not ignored by git (add /{WHEELS}/ to .gitignore), so it would travel twice")
    wheels = root / WHEELS
    if not offline:
        download(wheels)
    installs = resolve(wheels)
    names = sorted(p.name for p in wheels.glob("*.whl"))
    sizes = budget(root, wheels)
    if sizes["total_bytes"] > BUDGET_BYTES:
        raise KitError(f"{WHEELS}/: the working tree ({sizes['tree_bytes'] / 2**20:.1f} MiB) and the wheels "
                       f"({sizes['wheels_bytes'] / 2**20:.1f} MiB) exceed the {BUDGET_BYTES // 2**20} MiB a device "
                       "call may send")
    assert len(DEVICE_COMMAND) <= COMMAND_LIMIT
    return {"command": DEVICE_COMMAND, "carry": [WHEELS], "timeout_s": DEVICE_TIMEOUT_S, "wheels": names,
            "installs": installs, **sizes}


def render(facts: dict) -> str:
    mib = 2**20
    wheels = (f"wheels: {len(facts['wheels'])} in {WHEELS}/ ({facts['wheels_bytes'] / mib:.1f} MiB), complete for "
              f"Python {DEVICE_PYTHON} offline ({len(facts['installs'])} distributions)")
    sent = (f"sent per call: tree {facts['tree_bytes'] / mib:.1f} MiB + wheels {facts['wheels_bytes'] / mib:.1f} MiB "
            f"= {facts['total_bytes'] / mib:.1f} MiB of {facts['limit_bytes'] // mib} MiB")
    lines = [
        wheels,
        sent,
        "",
        "On the GPU machine: send the working tree with these ignored paths carried: " + ", ".join(facts["carry"]),
        f"allow the command {facts['timeout_s']} s, and bring back the folder it writes ($OUT):",
        "",
        f"    {facts['command']}",
        "",
        "Then read summary.json first (docs/kernels.md, 'The device kit').",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--offline", action="store_true", help="check the wheels already in .whl/; download nothing")
    parser.add_argument("--json", action="store_true", help="print the facts as JSON")
    args = parser.parse_args(argv)
    try:
        facts = prepare(offline=args.offline)
    except KitError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(facts, indent=2) if args.json else render(facts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
