# The two commands of the README: `make train` and `make test`. Each installs what is missing,
# configures and builds, then trains or runs every test. Other targets are for developers.
BUILD      ?= build
ASAN_BUILD ?= build-asan
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_ARGS ?=
CONFIG     ?= examples/mlp.ini

.PHONY: all deps configure build train test test-sanitize bench bench-mpi install format clean

all: build

deps:
	@sh scripts/install-deps.sh

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS)

configure: deps $(BUILD)/CMakeCache.txt

build: configure
	cmake --build $(BUILD) -j $(JOBS)

train: build
	$(BUILD)/fsdp-train --config $(CONFIG)

test: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

# The same tests under AddressSanitizer and UndefinedBehaviorSanitizer, warnings as errors.
test-sanitize: deps
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DFSDP_WERROR=ON \
	    -DFSDP_SANITIZE=address,undefined -DFSDP_BUILD_BENCH=OFF $(CMAKE_ARGS)
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	ctest --test-dir $(ASAN_BUILD) --output-on-failure -j $(JOBS)

bench: build
	$(BUILD)/bench/bench_gemm
	$(BUILD)/bench/bench_adam
	$(BUILD)/bench/bench_comm

# The collective benchmark on the MPI backend: NP processes (as root: MPIRUN_FLAGS=--allow-run-as-root).
NP          ?= 4
MPIRUN_FLAGS ?=
bench-mpi: build
	mpirun -np $(NP) --oversubscribe $(MPIRUN_FLAGS) $(BUILD)/bench/bench_comm

install: build
	cmake --install $(BUILD)

format:
	clang-format -i $$(git ls-files '*.c' '*.h')

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
