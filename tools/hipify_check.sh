#!/usr/bin/env bash
# ROCm path check without ROCm torch or an AMD GPU:
#  1. copy csrc/ into a scratch folder and run torch's own hipify over it the way
#     torch.utils.cpp_extension does for a ROCm build (is_pytorch_extension,
#     hipify_extra_files_only; include dirs = csrc/sources.txt "include"; files =
#     the "gpu" and "capi" groups, which pull in csrc/include/mla_ext/*.cuh);
#  2. fail on unsupported CUDA calls, a failed file, or a <<<...>>> launch or a
#     CUDA runtime header left in the hipified output;
#  3. compile the hipified torch-free sources (the C API, which instantiates every
#     kernel of the hipified headers) with Debian's hipcc (HIP_PLATFORM=amd) for
#     gfx90a and gfx940 (Debian 12's hipcc 5.2 knows no gfx942).
# The hipified torch binding (ops_cuda.cu) is hipified and scanned but not
# compiled: torch's headers need rocThrust, which Debian does not package.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
t0=$SECONDS
mkdir -p "$out/src"
cp -r csrc "$out/src/"

$PYTHON - "$out/src" <<'PY'
import contextlib, io, os, re, sys
from torch.utils.hipify import hipify_python

root = sys.argv[1]
groups = {}
for line in open(os.path.join(root, "csrc", "sources.txt")):
    line = line.split("#", 1)[0].strip()
    if line:
        g, p = line.split()
        groups.setdefault(g, []).append(os.path.join(root, p))
files = groups.get("gpu", []) + groups.get("capi", [])
log = io.StringIO()
with contextlib.redirect_stdout(log):
    result = hipify_python.hipify(project_directory=root, output_directory=root,
                                  header_include_dirs=groups["include"] + [os.path.dirname(f) for f in groups.get("capi", [])],
                                  includes=[os.path.join(root, "*")], extra_files=files, show_detailed=True,
                                  show_progress=False, is_pytorch_extension=True, hipify_extra_files_only=True)
text = log.getvalue()
bad = []
m = re.search(r"Total number of unsupported CUDA function calls: (\d+)", text)
if m is None or int(m.group(1)) != 0:
    bad.append("unsupported CUDA calls:\n" + text)
for src, res in sorted(result.items()):
    rel = os.path.relpath(src, root)
    hip = res.hipified_path or src
    print(f"hipify: {rel} -> {os.path.relpath(hip, root)} {res.status}")
    if "ok" not in res.status and "skipped" not in res.status:
        bad.append(f"{rel}: {res.status}")
    code = re.sub(r"//[^\n]*|/\*.*?\*/", "", open(hip).read(), flags=re.S)
    if "<<<" in code:
        bad.append(f"{rel}: a <<<...>>> launch survived hipify")
    if re.search(r"#\s*include\s*[<\"]cuda_runtime", code) and "MLA_EXT_HIP" not in code:
        bad.append(f"{rel}: includes a CUDA runtime header after hipify")
for f in files:
    if f not in result or not result[f].hipified_path:
        bad.append(f"{os.path.relpath(f, root)}: not hipified")
with open(os.path.join(root, "hipified_capi.txt"), "w") as fh:
    fh.write("\n".join(result[f].hipified_path for f in groups.get("capi", [])))
if bad:
    sys.exit("hipify_check: " + "\n".join(bad))
PY
echo "hipify_check: hipified in $((SECONDS - t0)) s"

if ! command -v hipcc >/dev/null; then
  echo "hipify_check: installing Debian's hipcc"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq hipcc) >/dev/null
fi
inc=()
for d in $(awk '$1 == "include" {print $2}' csrc/sources.txt); do inc+=(-I"$out/src/$d"); done
while read -r src; do
  echo "hipcc gfx90a+gfx940: ${src#"$out/src/"}"
  HIP_PLATFORM=amd hipcc --offload-arch=gfx90a --offload-arch=gfx940 -std=c++17 -O2 -Werror=return-type \
    "${inc[@]}" -I"$(dirname "$src")" -x hip -c "$src" -o "$out/$(basename "$src").o"
done < <(cat "$out/src/hipified_capi.txt"; echo)
echo "hipify_check: ok ($((SECONDS - t0)) s)"
