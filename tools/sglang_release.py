"""Run ``kvstate fuzz --target sglang`` against one SGLang release, without a venv of its own.

    python tools/sglang_release.py 0.5.19                   # the ci profile
    python tools/sglang_release.py 0.5.21 --dir /tmp/sgl-releases -- --examples 17 --steps 30

The release's wheel (8-35 MB) is downloaded with ``pip download --no-deps`` and unpacked into
``DIR/VERSION``; the run puts that directory first on ``PYTHONPATH``, over the active
environment's dependencies (the one ``tools/install_sglang.sh`` set up for 0.5.23).  Where a
release needs other versions of a dependency, only those go into ``DIR/deps/NAME-VERSION``
(``pip install --no-deps --target``) and onto the path: its pinned ``xgrammar`` always
(0.5.20's ``schedule_batch`` imports it at module level), and, when the release does not import
with the environment's ``transformers`` (0.5.19 and before: ``'qwen3_asr' is already used by a
Transformers config``), its pinned ``transformers`` with what that one requires (``tokenizers``
<= 0.23.0, ``huggingface_hub`` < 2, ``kernels`` < 0.13, ``httpx``, ``httpcore``, ``einops``).
Each release compiles SGLang's C++ hash extension into its own ``TORCH_EXTENSIONS_DIR`` (they
share a name and would rebuild over each other).  The fuzz runs from ``DIR`` (the repository's
``kernels/`` would shadow a package ``transformers`` imports).

Exit status: the fuzz's (0 pass, 1 a finding, 2 SGLang not importable), or 3 when the release
imports but no configuration could be built on it (the report names each one's error).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

OLD_TRANSFORMERS = ["tokenizers==0.22.2", "huggingface_hub>=1.5,<2", "kernels>=0.12,<0.13",
                    "httpx", "httpcore", "einops"]  # fmt: skip
IMPORT = "import kvstate.targets.sglang.imports as i; i.load(); print(i.version())"


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "-q", *args], check=True)


def unpack(version: str, root: Path) -> Path:
    """``root/version``, the release's wheel unpacked there (downloaded once)."""
    where = root / version
    if (where / "sglang").is_dir():
        return where
    wheels = root / "wheels"
    pip("download", "--no-deps", "-d", str(wheels), f"sglang=={version}")
    (wheel,) = [w for w in wheels.glob(f"sglang-{version}-*.whl")]
    with zipfile.ZipFile(wheel) as z:
        z.extractall(where)
    return where


def pins(release: Path, version: str) -> dict[str, str]:
    """The release's pinned ``name==version`` requirements, from its wheel's metadata."""
    meta = (release / f"sglang-{version}.dist-info" / "METADATA").read_text()
    return dict(re.findall(r"^Requires-Dist: ([A-Za-z0-9_.-]+)==([^\s;]+)", meta, re.M))


def dep(root: Path, *requirements: str) -> Path:
    """A directory holding ``requirements`` (installed with --no-deps once)."""
    name = "+".join(re.sub(r"[^A-Za-z0-9_.-]+", "_", r) for r in requirements)
    where = root / "deps" / name
    if not where.is_dir():
        pip("install", "--no-deps", "--target", str(where), *requirements)
    return where


def imports(env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-W", "ignore", "-c", IMPORT], env=env, cwd=cwd,
                          capture_output=True, text=True)  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("version", help="an SGLang release, e.g. 0.5.19")
    ap.add_argument("--dir", type=Path, default=Path("/tmp/sgl-releases"))
    ap.add_argument("--profile", default="ci")
    ap.add_argument("fuzz", nargs="*", help="more `kvstate fuzz` arguments (after --)")
    args = ap.parse_args()
    root = args.dir.resolve()
    root.mkdir(parents=True, exist_ok=True)
    release = unpack(args.version, root)
    pinned = pins(release, args.version)
    path = [release]
    if "xgrammar" in pinned:
        path.append(dep(root, f"xgrammar=={pinned['xgrammar']}"))
    if importlib.util.find_spec("einops") is None:  # the Mamba stacks' decode imports it
        path.append(dep(root, "einops"))
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(release / ".torch_extensions"))
    env["PYTHONPATH"] = os.pathsep.join(map(str, path))
    probe = imports(env, root)
    if probe.returncode != 0 and "transformers" in pinned:
        print(f"SGLang {args.version} does not import with this environment's transformers "
              f"({probe.stderr.strip().splitlines()[-1]}); adding transformers=="
              f"{pinned['transformers']}", flush=True)  # fmt: skip
        path.append(dep(root, f"transformers=={pinned['transformers']}"))
        path.append(dep(root, *OLD_TRANSFORMERS))
        env["PYTHONPATH"] = os.pathsep.join(map(str, path))
        probe = imports(env, root)
    if probe.returncode != 0:
        print(f"SGLang {args.version} is not importable: {probe.stderr.strip()[-800:]}")
        return 2
    print(f"SGLang {probe.stdout.strip()} from {release}; PYTHONPATH={env['PYTHONPATH']}")
    cmd = [sys.executable, "-W", "ignore", "-m", "kvstate", "fuzz", "--target", "sglang",
           "--profile", args.profile, *args.fuzz]  # fmt: skip
    run = subprocess.run(cmd, env=env, cwd=root, capture_output=True, text=True)
    sys.stdout.write(run.stdout)
    if run.returncode == 0 and "configurations exercised (0)" in run.stdout:
        print(f"NOT DRIVEN: no configuration builds on SGLang {args.version}")
        return 3
    return run.returncode


if __name__ == "__main__":
    sys.exit(main())
