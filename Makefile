# mla_ext: set up, run, test. Every target works on a fresh machine (`bench` needs a GPU: without
# one it stops with a one-line message, status 1): it installs
# torch==2.13.0 (from pip's index; the CPU wheel on our build machines) only when no torch >= 2.10 is present, and uses the
# installed torch (CUDA/ROCm included) otherwise, downloading nothing then.
PYTHON ?= python3
export MAX_JOBS ?= $(shell nproc 2>/dev/null || echo 2)

.PHONY: setup run test compile-check cmake-check hipify-check hip-chroot-check wheel-size bench wheel clean

setup:
	$(PYTHON) tools/bootstrap.py numpy tabulate tqdm pytest setuptools wheel ninja --optional matplotlib
	$(PYTHON) tools/needs_build.py || $(PYTHON) -m pip install -q --no-build-isolation --no-deps -e .

# The main job: the attention of one DeepSeek decode step (default: V4 Flash, TP 8; small
# sizes on a CPU, realistic ones on a GPU), verified and timed; then merge_attn_states.
run: setup
	$(PYTHON) -m mla_ext.cli decode
	$(PYTHON) -m mla_ext.cli merge

test: setup
	$(PYTHON) -m pytest -q tests

compile-check: setup
	tools/compile_check.sh

# CMake package (CUDA, compile + link only) and examples/cpp built against it.
cmake-check:
	tools/cmake_check.sh

# torch's hipify over the GPU sources, then Debian's hipcc on the result.
hipify-check:
	$(PYTHON) tools/bootstrap.py
	tools/hipify_check.sh

# The kernels and the C API for gfx942 (MI300) with Debian 13's hipcc 5.7 and for gfx950 (MI350)
# with Debian unstable's hipcc (HIP 6.4, clang 21), each in a debootstrap chroot (tools/hip_chroot_check.sh).
hip-chroot-check:
	tools/hip_chroot_check.sh trixie gfx942
	tools/hip_chroot_check.sh sid gfx950

# Size of the built extension per kernel family (builds nothing; run `make setup` first).
wheel-size:
	$(PYTHON) tools/wheel_size.py

# The merge benchmark against a device-to-device copy (GPU only; the other benchmarks/ scripts too).
bench: setup
	$(PYTHON) benchmarks/bench_merge.py

wheel:
	$(PYTHON) tools/bootstrap.py setuptools wheel build
	$(PYTHON) -m build --wheel --no-isolation

clean:
	rm -rf build dist *.egg-info mla_ext/_C*.so mla_ext/_build_info.py
