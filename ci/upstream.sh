# Sourced by the ci/build-*.sh scripts that build an upstream operand's programs from its Go module at a pinned
# version, through the Go module proxy, for the real-node test tier. The module is built inside a copy of its
# folder, with its own go.mod and go.sum; this repository's go.mod is not involved. Needs progress.sh sourced.

# upstream_field NAME JSON: the string field NAME of `go mod download -json` output JSON.
upstream_field() { sed -n "s/^\t*\"$1\": \"\(.*\)\",\{0,1\}\$/\1/p" <<<"$2"; }

# upstream_download MODULE@VERSION: the module's `go mod download -json`; exits 3 (the source cannot be had) when
# the proxy fails.
upstream_download() {
  local json
  json=$(go mod download -json "$1") ||
    { echo "cannot download $1 through the Go module proxy ($(go env GOPROXY)): $(upstream_field Error "$json")" >&2; exit 3; }
  echo "$json"
}

# upstream_modules SRC WHAT: downloads the modules the copied module SRC needs (WHAT names it in the error); exits 3
# when the proxy fails.
upstream_modules() {
  progress_run "modules (download)" bash -c 'cd "$1" && go mod download' _ "$1" ||
    { echo "cannot download the modules $2 needs through the Go module proxy ($(go env GOPROXY))" >&2; exit 3; }
}

# upstream_build SRC OUT LDFLAGS [BUILDFLAG...] -- BIN...: builds ./cmd/BIN of the module copy SRC into OUT/BIN for
# each BIN, with -trimpath, LDFLAGS and the extra build flags.
upstream_build() {
  local src=$1 out=$2 ldflags=$3 flags=() n=0 b
  shift 3
  while [ "$1" != "--" ]; do flags+=("$1"); shift; done
  shift
  for b in "$@"; do
    n=$((n + 1))
    progress_run "$b ($n of $#)" \
      bash -c 'cd "$1" && go build -trimpath "${@:5}" -ldflags "$2" -o "$3" "./cmd/$4"' _ "$src" "$ldflags" "$out/$b" "$b" "${flags[@]}"
  done
}
