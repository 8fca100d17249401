#!/usr/bin/env bash
# The GPU check in one call on a GPU machine lent without network (docs/gpus.md, "A GPU machine
# without network"), from the source tree with .gpu/ (GPU_BUNDLE) as benchmarks/gpu_bundle.py left it:
#   1. .gpu/site.tar.gz unpacked and put first on PYTHONPATH; transformers 5 from .gpu/hf where the
#      machine's is older; the source tree's conf/ and recipes/ where the framework looks for them;
#   2. what the machine is and where each package the framework needs is found, into $OUT/machine.txt;
#   3. benchmarks/gpu_check.py under a time limit (BUDGET_S, default 540 s: a device call may run
#      600): no row starts after BUDGET_S - TAIL_S seconds, so that those running end and the table
#      is whole; the table in $OUT/gpu_check.md (rewritten as each row ends), each failed row's
#      output in $OUT/failed/.
# Rows no GPU has shown ok run first, then the performance runs, then the rest.
#
#   OUT=/some/folder benchmarks/gpu_session.sh [gpu_check.py's arguments, e.g. --rows ... --perf off]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:?"set OUT to the folder for the results"}
budget=${BUDGET_S:-540}
tail_s=${TAIL_S:-150}
python=${GPU_PYTHON:-python3}
bundle=${GPU_BUNDLE:-.gpu}
mkdir -p "$out"

bundle=$(cd "$bundle" 2>/dev/null && pwd || echo "$bundle")
if [ -f "$bundle/site.tar.gz" ] && [ ! -d "$bundle/site" ]; then
  tar -xzf "$bundle/site.tar.gz" -C "$bundle"
fi
[ -d "$bundle/site" ] && export PYTHONPATH="$bundle/site${PYTHONPATH:+:$PYTHONPATH}" PATH="$bundle/site/bin:$PATH"
if [ -d "$bundle/hf-site" ]; then  # installed by an earlier run
  export PYTHONPATH="$bundle/hf-site${PYTHONPATH:+:$PYTHONPATH}"
elif ! "$python" -c 'import importlib.metadata as m, sys; sys.exit(int(m.version("transformers").split(".")[0]) < 5)' \
    2>/dev/null \
    && compgen -G "$bundle/hf/*.whl" > /dev/null; then
  "$python" -m pip install --quiet --no-deps --no-index --no-compile --target "$bundle/hf-site" "$bundle"/hf/*.whl \
    && export PYTHONPATH="$bundle/hf-site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD" PYTHONUNBUFFERED=1

# Where the source tree is not installed: its YAML trees as the packages framework.conf and
# framework.recipes (setup.py installs them so), linked for this run only (every process using this
# tree meanwhile sees the links: run it in a copy, as the device machine's is)
linked=()
if ! "$python" -c 'import framework.conf, framework.recipes' 2>/dev/null; then
  for tree in conf recipes; do
    if [ ! -e "framework/$tree" ]; then ln -s "../$tree" "framework/$tree" && linked+=("framework/$tree"); fi
  done
fi
trap 'rm -f ${linked[@]+"${linked[@]}"}' EXIT

{
  date -u
  if command -v nvidia-smi > /dev/null; then nvidia-smi; else echo "nvidia-smi: not found"; fi
  "$python" - <<'EOF'
import importlib.metadata, importlib.util, sys
import torch
print("python", sys.version.split()[0], "| torch", torch.__version__, "| CUDA", torch.version.cuda,
      "|", torch.cuda.device_count(), "GPU(s):", [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])
# where each package the framework needs is found, and its version (found, not imported: an import
# that fails shows in the rows that need it)
for module, dist in [("framework.conf", None), ("hydra", "hydra-core"), ("omegaconf", "omegaconf"),
                     ("torchdata", "torchdata"), ("rich", "rich"), ("psutil", "psutil"), ("sklearn", "scikit-learn"),
                     ("deepspeed", "deepspeed"), ("fairscale", "fairscale"), ("bitsandbytes", "bitsandbytes"),
                     ("torchft", "torchft"), ("transformers", "transformers"), ("lightning", "lightning")]:
    try:
        spec = importlib.util.find_spec(module)
    except ModuleNotFoundError:
        spec = None
    if spec is None:
        print(f"  {module}: MISSING")
        continue
    version = importlib.metadata.version(dist) if dist else ""
    print(f"  {module}: {version} {spec.origin or list(spec.submodule_search_locations or [])}")
EOF
} > "$out/machine.txt" 2>&1
cat "$out/machine.txt"

timeout --signal=TERM --kill-after=20 "$budget" "$python" benchmarks/gpu_check.py --parallel "${PARALLEL:-8}" \
  --deadline $((budget - tail_s)) --out "$out/gpu_check.md" --failed-logs "$out/failed" "$@"
status=$?
[ "$status" = 124 ] && echo "gpu_session: stopped at ${budget} s; $out/gpu_check.md holds the rows that ended" >&2
exit "$status"
