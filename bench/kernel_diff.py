#!/usr/bin/env python3
"""What a kernel change does to the compiled code, here, without a GPU.

    python3 bench/kernel_diff.py [--base REV] [--arch ARCH ...] [MODULE ...]

Builds `flashsel-dev` at REV (default HEAD, in a git worktree) and in the
working tree, compiles each MODULE (default: every shipped module, e.g.
select/filter, select/filter_tokens) for each ARCH (default sm_80 sm_86 sm_89
sm_90a) with NVRTC through `flashsel-dev cubin`, and prints, per kernel:

  - its registers, base -> new, and its spill bytes (stores, loads) when any;
  - whether its SASS is the base's (nvdisasm; addresses, label numbers and
    call targets normalised, so a renamed template argument of an out-of-line
    callee still compares equal), else the instruction counts.

Why: ptxas allocates a kernel's out-of-line callees together, so an edit in
one path can move the code (and the time) of kernels that never run it
(docs/perf-log.md v45, v46). A kernel whose SASS is the base's needs no
device time to show it did not regress.

Needs cargo, python3 with pip (NVRTC 13.0.88 and nvdisasm 13.5.37 are
installed from their pinned PyPI wheels into target/ when missing). Exit
status 1 when a new kernel spills.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NVDISASM_VERSION = "13.5.37"
ARCHS = ["sm_80", "sm_86", "sm_89", "sm_90a"]


def say(msg):
    print(f"[kernel_diff] {msg}", file=sys.stderr, flush=True)


def nvrtc_lib():
    out = subprocess.run(["bash", ".ci/install-nvrtc.sh", "target/nvrtc"], cwd=ROOT, check=True,
                         stdout=subprocess.PIPE, text=True)
    return out.stdout.strip()


def nvdisasm():
    target = ROOT / "target" / "nvdisasm"
    tool = target / "nvidia" / "cu13" / "bin" / "nvdisasm"
    if not tool.exists() or not (target / f"nvidia_cuda_nvdisasm-{NVDISASM_VERSION}.dist-info").exists():
        say(f"installing nvidia-cuda-nvdisasm=={NVDISASM_VERSION} into {target}")
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--root-user-action=ignore", "--no-deps",
                        "--upgrade", "--target", str(target), f"nvidia-cuda-nvdisasm=={NVDISASM_VERSION}"], check=True)
    return str(tool)


def build(rev, work):
    """flashsel-dev of the working tree, and of `rev` in a worktree."""
    say("building flashsel-dev (working tree)")
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "flashsel-dev"], cwd=ROOT, check=True)
    new = ROOT / "target" / "release" / "flashsel-dev"
    wt = Path(tempfile.mkdtemp(prefix="flashsel-kd."))
    subprocess.run(["git", "worktree", "add", "--detach", "-f", str(wt), rev], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL)
    try:
        say(f"building flashsel-dev ({rev})")
        env = dict(os.environ, CARGO_TARGET_DIR=str(Path(tempfile.gettempdir()) / "flashsel-kd-target"))
        subprocess.run(["cargo", "build", "--release", "-q", "-p", "flashsel-dev"], cwd=wt, env=env, check=True)
        base = work / "flashsel-dev.base"
        base.write_bytes((Path(env["CARGO_TARGET_DIR"]) / "release" / "flashsel-dev").read_bytes())
        base.chmod(0o755)
    finally:
        subprocess.run(["git", "worktree", "remove", "-f", str(wt)], cwd=ROOT, check=False)
    return base, new


def modules(tool, env):
    # An unknown module name makes `cubin` list the modules.
    r = subprocess.run([str(tool), "cubin", "sm_90a", "?"], env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    return re.findall(r'"([^"]+)"', r.stdout.split("modules:", 1)[-1])


def compile_one(tool, env, arch, module, out):
    r = subprocess.run([str(tool), "cubin", arch, module, str(out)], env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{tool.name} cubin {arch} {module}: exit {r.returncode}\n{r.stdout[-2000:]}")
    return r.stdout


def ptxas_info(log):
    """{function: (registers or None, (spill stores, spill loads))} from a ptxas -v log."""
    info, cur = {}, None
    for line in log.splitlines():
        m = re.search(r"Function properties for (\S+)", line)
        if m:
            cur = m.group(1)
            info.setdefault(cur, [None, (0, 0)])
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and cur:
            info[cur][1] = (int(m.group(1)), int(m.group(2)))
        m = re.search(r"Used (\d+) registers", line)
        if m and cur:
            info[cur][0] = int(m.group(1))
    return info


def sass(tool, cubin):
    """{kernel: [normalised instruction]} from nvdisasm, callees included in their kernel's section."""
    text = subprocess.run([tool, "-c", str(cubin)], check=True, stdout=subprocess.PIPE, text=True).stdout
    out, cur = {}, None
    for line in text.splitlines():
        s = line.strip()
        if s.startswith(".text.") and s.endswith(":"):
            cur = s[len(".text."):-1]
            out[cur] = []
        elif cur is not None and re.search(r"/\*[0-9a-f]{4,}\*/", s):
            ins = re.sub(r"/\*[0-9a-f]+\*/", "", s).strip()
            ins = re.sub(r"`\([^)]*\)", "L", ins)  # branch and call targets
            out[cur].append(ins)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="HEAD", help="the revision to compare with (default HEAD)")
    ap.add_argument("--arch", action="append", help=f"an arch (repeatable; default {' '.join(ARCHS)})")
    ap.add_argument("modules", nargs="*", help="modules (default: all)")
    a = ap.parse_args()
    archs = a.arch or ARCHS
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = nvrtc_lib() + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    dis = nvdisasm()
    work = ROOT / "target" / "kernel-diff"
    work.mkdir(parents=True, exist_ok=True)
    base_tool, new_tool = build(a.base, work)
    mods = a.modules or modules(new_tool, env)
    spills = same = changed = 0
    for module in mods:
        for arch in archs:
            tag = module.replace("/", "_") + "." + arch
            cb, cn = work / f"{tag}.base.cubin", work / f"{tag}.new.cubin"
            ib = ptxas_info(compile_one(base_tool, env, arch, module, cb))
            inew = ptxas_info(compile_one(new_tool, env, arch, module, cn))
            sb, sn = sass(dis, cb), sass(dis, cn)
            print(f"== {module} {arch}")
            for k in sorted(set(sb) | set(sn)):
                rb = ib.get(k, [None])[0]
                rn, sp = inew.get(k, [None, (0, 0)])
                if k not in sn:
                    print(f"  {k}: gone")
                    continue
                if k not in sb:
                    print(f"  {k}: new, {rn} registers" + (f", SPILLS {sp}" if sp != (0, 0) else ""))
                    spills += sp != (0, 0)
                    continue
                ident = sb[k] == sn[k]
                same += ident
                changed += not ident
                regs = f"{rb} registers" if rb == rn else f"{rb} -> {rn} registers"
                what = "SASS as base" if ident else f"SASS differs ({len(sb[k])} -> {len(sn[k])} instructions)"
                note = f", SPILLS {sp[0]} B stored, {sp[1]} B loaded" if sp != (0, 0) else ""
                spills += sp != (0, 0)
                print(f"  {k}: {regs}, {what}{note}")
    print(f"kernels with the base's SASS: {same}, changed: {changed}, spilling: {spills}")
    return 1 if spills else 0


if __name__ == "__main__":
    sys.exit(main())
