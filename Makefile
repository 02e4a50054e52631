# The two commands of the README: `make train` and `make test`. Each installs what is missing,
# configures and builds what it runs (the trainer alone, or everything), then trains or runs
# every test. Other targets are for developers.
BUILD      ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_ARGS ?=
CONFIG     ?= examples/digits.ini
PREFIX     ?= /usr/local

.PHONY: all deps configure build train test test-coretypes sanitize-build test-sanitize test-tsan \
	fuzz-config fuzz-ckpt bench bench-mpi bench-scaling install format clean

all: build

deps:
	@sh scripts/install-deps.sh

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS)

configure: deps $(BUILD)/CMakeCache.txt

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# Builds only the trainer (the library and fsdp-train, not the tests and benchmarks), then trains.
train: configure
	cmake --build $(BUILD) -j $(JOBS) --target fsdp-train
	$(BUILD)/fsdp-train --config $(CONFIG)

test: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

# The numerical suites (CTest label numerics) again under every OpenBLAS kernel family this CPU
# can execute (OPENBLAS_CORETYPE Prescott, Sandybridge, Haswell, Zen, and SkylakeX with
# AVX-512), so that no bound holds for one kernel only (docs/testing.md "Bounds").
test-coretypes: build
	sh scripts/test-coretypes.sh $(BUILD) $(JOBS)

# The same tests under AddressSanitizer and UndefinedBehaviorSanitizer, warnings as errors.
# Debug (asserts on) at -O1, as the sanitizers' authors advise for speed: on the 2-core
# machine the suite took 477 s at -O1 against 579 s at -O0.
sanitize-build: deps
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug "-DCMAKE_C_FLAGS_DEBUG=-g -O1" \
	    -DFSDP_WERROR=ON \
	    -DFSDP_SANITIZE=address,undefined -DFSDP_BUILD_BENCH=OFF $(CMAKE_ARGS)
	cmake --build $(ASAN_BUILD) -j $(JOBS)

# Left out, so that the CI run stays within its time on two cores: the device suites'
# cuda-mode rehearsals (label rehearsal; their code runs in the suites' own entries) and the
# wide mpirun entries (label mpi_wide, 4 and 8 processes but the MPI backend's meshes; their
# bodies run as rank threads here and under mpirun in `make test`: tests/CMakeLists.txt).
test-sanitize: sanitize-build
	ctest --test-dir $(ASAN_BUILD) --output-on-failure -j $(JOBS) -LE 'rehearsal|mpi_wide'

# The tests under ThreadSanitizer (optimised, with debug info: TSan at -O0 is several times
# slower), all but the entries under mpirun (label mpi): Open MPI is not built with TSan, so
# the synchronisation of its progress thread and shared-memory transport is invisible to it,
# and each of those processes runs one rank thread; the same bodies run as rank threads here.
# tests/tsan.supp names what is suppressed and why. The cuda-mode rehearsals (label rehearsal)
# are left out as under ASan: the same rank threads on sim run in the suites' own entries.
test-tsan: deps
	cmake -S . -B $(TSAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFSDP_WERROR=ON \
	    -DFSDP_SANITIZE=thread -DFSDP_BUILD_BENCH=OFF $(CMAKE_ARGS)
	cmake --build $(TSAN_BUILD) -j $(JOBS)
	ctest --test-dir $(TSAN_BUILD) --output-on-failure -j $(JOBS) -LE 'mpi|rehearsal'

# FUZZ_COUNT random valid fsdp-train configurations under the ASan/UBSan build, each against
# the same model on one rank (tests/config_fuzz.py). CI runs 40; the default is the full run.
FUZZ_COUNT ?= 300
FUZZ_SEED  ?= 1
fuzz-config: sanitize-build
	python3 tests/config_fuzz.py --exe $(ASAN_BUILD)/fsdp-train --count $(FUZZ_COUNT) \
	    --seed $(FUZZ_SEED) --jobs $(JOBS)

# The checkpoint reader's fuzz target for FUZZ_MINUTES under ASan and UBSan (libFuzzer with
# clang, else the standalone driver): scripts/fuzz-ckpt.sh. CI runs its short seeded campaign as
# the fuzz_ckpt_reader test.
FUZZ_MINUTES ?= 5
fuzz-ckpt: deps
	sh scripts/fuzz-ckpt.sh $(FUZZ_MINUTES)

bench: build
	$(BUILD)/bench/bench_gemm
	$(BUILD)/bench/bench_adam
	$(BUILD)/bench/bench_comm

# Scaling over this machine's cores: bench_scaling with its profile, PyTorch with the same
# threads (when torch is importable), the collectives at 4 ranks (bench/README.md).
bench-scaling: build
	bench/scaling.sh $(BUILD)

# The collective benchmark on the MPI backend: NP processes (as root: MPIRUN_FLAGS=--allow-run-as-root).
NP          ?= 4
MPIRUN_FLAGS ?=
bench-mpi: build
	mpirun -np $(NP) --oversubscribe $(MPIRUN_FLAGS) $(BUILD)/bench/bench_comm

# Replicate's gradient-reduction schedules on seed 004's Net (bench/README.md): NP rank threads,
# then NP MPI processes of one OpenBLAS thread each.
.PHONY: bench-overlap
bench-overlap: build
	$(BUILD)/bench/bench_ddp_overlap --ranks $(NP)
	OPENBLAS_NUM_THREADS=1 mpirun -np $(NP) --oversubscribe $(MPIRUN_FLAGS) \
	    $(BUILD)/bench/bench_ddp_overlap

# Into PREFIX (default /usr/local, as CMake's), e.g. make install PREFIX=$HOME/.local
install: build
	cmake --install $(BUILD) --prefix "$(PREFIX)"

format:
	clang-format -i $$(git ls-files '*.c' '*.h')

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD)
