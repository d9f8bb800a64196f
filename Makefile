# kube-gpu-stack: `make demo` shows the chart at work, `make test` runs every test.
GO ?= go
# go-nvml wraps every NVML call, and NVML 13 marks some of them deprecated: gcc warned about each (some 150 lines)
# when the package first compiled on a machine, which says nothing about this project's own calls
export CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations

.PHONY: test demo golden generate vet fmt-check package image cli controlplane node prometheus bench-scale bench-rollout soak

## test: vet, format check, and every Go test (golden, role matrix, schema, invariants, lint, alert rules with
## promtool, e2e on the local control plane; the control plane and promtool are built first when this machine has
## not built them yet). TEST_PACKAGES packages run at once: the control-plane suites mostly wait on controllers,
## so more of them than cores overlap well (each takes about 1 GiB per control plane; tests/e2e runs 3).
## SLOW_PACKAGES start first, longest first by their time in a whole run (e2e and chart 7 to 8 minutes, faults 6,
## rollout 5, gitops 3, the rest under 1.5), so no long suite starts last and runs alone at the end. The test
## binaries are linked without symbol table and DWARF (-s -w): linking some sixty of them is a tenth of the run's
## CPU otherwise, and stack traces and runtime.Caller read the line tables, which stay. They are linked by Go's own
## linker (-linkmode=internal): kustomize (through kubectl's drain) imports the plugin package and go-nvml is cgo,
## either of which makes the default an external link through gcc and ld, a third more CPU per binary; no test
## calls into C (the NVML tests use go-nvml's mock; ci/gpu-smoke.sh builds its own binary). `go test` does not vet
## again (-vet=off): the vet target ran every analyzer on every package just before. Everything is built with
## -trimpath (BUILD_FLAGS), so the build cache does not depend on where the clone is: a new clone of a commit
## already built on this machine compiles nothing, and go test reuses the results of unchanged tests that read
## no file of the clone (`go clean -testcache` before a run measures every test). Every Go process of the run (go,
## the linker, the test binaries, the control planes) runs with the runtime's allocation sampling off
## (GODEBUG=memprofilerate=0: no test reads a memory profile, and the sampling's stack table is paid on every GC)
## and collects garbage at a heap 4 times the live one (GOGC=400; the run's memory peaks under 9 GiB). Each runs on
## one thread of Go code at a time (GOMAXPROCS=1 unless set): the run keeps some thirty Go processes on two cores,
## and with a thread per core each one's idle scheduler spins looking for work and its collector marks in
## parallel, which cost tests/e2e a tenth of its CPU (386 and 380 s with two, 345 and 348 s with one)
TEST_PACKAGES ?= 4
BUILD_FLAGS = -trimpath
SLOW_PACKAGES = ./tests/e2e ./tests/chart ./tests/faults ./tests/rollout ./tests/soak ./tests/gitops ./tests/takeover ./hooks/node/drivermanager \
	./tests/dra ./tests/node ./tests/drainbench
test: vet fmt-check prometheus
	KUBEBUILDER_ASSETS=$$(./ci/build-controlplane.sh) && export KUBEBUILDER_ASSETS && \
		GOGC=400 GODEBUG=memprofilerate=0$${GODEBUG:+,$$GODEBUG} GOMAXPROCS=$${GOMAXPROCS:-1} $(GO) test $(BUILD_FLAGS) -p $(TEST_PACKAGES) -vet=off -ldflags='-s -w -linkmode=internal' -timeout 30m $(SLOW_PACKAGES) ./...

## bench-rollout: the rollout overhead benchmark (tests/rolloutbench): a driver change across 200 simulated GPU nodes
## of one pool, maxUnavailable 20, each install taking 30 s, without and with a canary; about 25 minutes on 2 cores.
## BENCH_ROLLOUT_ARGS passes -nodes, -install, -max-unavailable
bench-rollout:
	KUBEBUILDER_ASSETS=$$(./ci/build-controlplane.sh) $(GO) test ./tests/rolloutbench -run XXX -bench . -benchtime 1x -timeout 90m -v -args $(BENCH_ROLLOUT_ARGS)

## soak: the fleet soak (tests/soak) over seeds 1 to SOAK_SEEDS (`make test` runs seeds 1 and 2): 99 simulated GPU nodes in
## three driver pools, a driver change per seed under random re-syncs, NotReady nodes, GPU pods landing on nodes
## being emptied (some held by a finalizer), driver pods deleted by hand, Nodes registered again, a pool renamed and a
## rollback, and (here, not in `make test`) new drivers failing validation on a few nodes, which revert by themselves;
## with the invariant checker; prints the seeds it covered. SOAK_SEED=N replays one
SOAK_SEEDS ?= 20
soak:
	KUBEBUILDER_ASSETS=$$(./ci/build-controlplane.sh) $(GO) test ./tests/soak -run TestSoak -count 1 -timeout 180m -v \
		-args -driver-faults -seeds $(SOAK_SEEDS) $(if $(SOAK_SEED),-seed $(SOAK_SEED))

## controlplane: build (or reuse) kube-apiserver, controller-manager, scheduler, etcd and kwok; prints their folder
controlplane:
	./ci/build-controlplane.sh

## node: build (or reuse) the kubelet of the real-node tests (tests/node) in the same cache; prints its folder
node:
	./ci/build-node.sh

## prometheus: build (or reuse) promtool and the PromQL checker of the alert tests (tests/monitoring, which builds
## them itself when missing) from the ci/prometheus module; prints their folder
prometheus:
	./ci/build-prometheus.sh

## demo: local control plane + simulated GPU nodes, the chart installed (mixed profile), what runs where;
## DEMO_ARGS=-keep leaves it running
demo:
	KUBEBUILDER_ASSETS=$$(./ci/build-controlplane.sh) $(GO) run $(BUILD_FLAGS) ./ci/demo $(DEMO_ARGS)

## bench-scale: every scale benchmark on the local control plane, one after the other: tests/scale (1,000 simulated
## GPU nodes: the gate, the admin CLI, renders, API load), then tests/rolloutbench (bench-rollout's defaults);
## numbers, not assertions, quoted in docs/development.md, Benchmarks
bench-scale:
	KUBEBUILDER_ASSETS=$$(./ci/build-controlplane.sh) && export KUBEBUILDER_ASSETS && \
		$(GO) test -run XXX -bench . -benchtime 1x -timeout 60m ./tests/scale/... && \
		$(GO) test -run XXX -bench . -benchtime 1x -timeout 90m -v ./tests/rolloutbench

## golden: rewrite the golden files of rendered manifests (tests/chart/testdata/golden) after an intended chart
## change, then review the diff like code
golden:
	UPDATE_GOLDEN=1 $(GO) test ./tests/chart -run 'TestGolden'

## generate: rewrite what the repository generates: the chart's Grafana dashboards (ci/dashboards), every chart's
## values.schema.json from its values.yaml, and the chart's images.txt and Chart.yaml artifacthub.io/images
## annotation from rendering every profile (ci/generate), and the simulated NVML's stubs of every other nvml.h
## function (tests/node/simnvml); tests fail naming `make generate` when one is stale
generate:
	$(GO) run ./ci/dashboards -out charts/kube-gpu-stack/dashboards
	$(GO) run ./ci/generate
	$(GO) generate ./tests/node/simnvml

vet:
	$(GO) vet $(BUILD_FLAGS) ./...

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "not gofmt'ed: $$out"; exit 1; fi

## package: the chart as one .tgz with every operand inside (dist/)
package:
	$(GO) tool helm package charts/kube-gpu-stack -d dist

## image: the project's image (the in-cluster binary, linux/amd64 + linux/arm64) as an OCI layout in dist/image
image:
	$(GO) run ./hooks/cmd/kube-gpu-stack image build --out dist/image

## cli: the kube-gpu-stack command users run (plan, migrate, image, airgap, status...) for each OS and
## architecture, static and reproducible, as dist/kube-gpu-stack-<os>-<arch>
CLI_PLATFORMS ?= linux/amd64 linux/arm64 darwin/amd64 darwin/arm64
cli:
	@for p in $(CLI_PLATFORMS); do \
	  os=$${p%/*}; arch=$${p#*/}; echo "building dist/kube-gpu-stack-$$os-$$arch"; \
	  CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch $(GO) build -trimpath -buildvcs=false -ldflags='-s -w -buildid=' \
	    -o dist/kube-gpu-stack-$$os-$$arch ./hooks/cmd/kube-gpu-stack || exit 1; \
	done
