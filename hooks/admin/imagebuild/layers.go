package imagebuild

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// layerFile is a built layer with what it holds, for the config's history and labels.
type layerFile struct {
	layer v1.Layer
	what  string
	names []string
}

// entry is one file, directory or symbolic link of a layer.
type entry struct {
	path string // relative, no leading slash
	mode int64
	uid  int
	dir  bool
	link string // the target of a symbolic link
	data []byte
}

// etcLayer holds the non-root user and group, and a sticky /tmp. It is the same for every platform, so the
// registry stores it once. No CA bundle: the in-cluster clients trust the service account's CA and the airgap
// commands run on the admin's machine, not in this image.
func etcLayer(mtime time.Time) (layerFile, error) {
	id := fmt.Sprint(NonRootID)
	entries := []entry{
		{path: "etc", mode: 0o755, dir: true},
		{path: "etc/passwd", mode: 0o644, data: []byte("root:x:0:0:root:/root:/sbin/nologin\n" +
			"nonroot:x:" + id + ":" + id + ":nonroot:/home/nonroot:/sbin/nologin\n")},
		{path: "etc/group", mode: 0o644, data: []byte("root:x:0:\nnonroot:x:" + id + ":\n")},
		{path: "home", mode: 0o755, dir: true},
		{path: "home/nonroot", mode: 0o700, uid: NonRootID, dir: true},
		{path: "tmp", mode: 0o1777, dir: true},
	}
	l, err := gzipLayer(entries, mtime)
	return layerFile{layer: l, what: "/etc/passwd, /etc/group (nonroot " + id + "), /tmp"}, err
}

// binariesLayer holds the built file as BinDir/name, owned by root and executable by all, and each of links as a
// relative symbolic link to it in the same folder: the name a command is started as selects it.
func binariesLayer(file, name string, links []string, mtime time.Time) (layerFile, error) {
	bin := strings.TrimPrefix(BinDir, "/")
	var entries []entry
	for p := bin; p != "."; p = filepath.Dir(p) {
		entries = append(entries, entry{path: p, mode: 0o755, dir: true})
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return layerFile{}, fmt.Errorf("built binary %s: %w", name, err)
	}
	entries = append(entries, entry{path: bin + "/" + name, mode: 0o755, data: data})
	what := BinDir + ": " + name
	for _, l := range links {
		entries = append(entries, entry{path: bin + "/" + l, mode: 0o777, link: name})
		what += ", " + l + " -> " + name
	}
	l, err := gzipLayer(entries, mtime)
	return layerFile{layer: l, what: what, names: append([]string{name}, links...)}, err
}

// gzipLayer writes the entries as a tar stream sorted by path, every header fixed (mtime, owner, no user names),
// gzipped with a fixed level and an empty gzip header, so the same entries always give the same digest.
func gzipLayer(entries []entry, mtime time.Time) (v1.Layer, error) {
	sort.Slice(entries, func(i, j int) bool { return entries[i].path < entries[j].path })
	var gz bytes.Buffer
	zw, err := gzip.NewWriterLevel(&gz, gzip.DefaultCompression)
	if err != nil {
		return nil, err
	}
	tw := tar.NewWriter(zw)
	for _, e := range entries {
		h := &tar.Header{
			Name:    e.path,
			Mode:    e.mode,
			Uid:     e.uid,
			Gid:     e.uid,
			ModTime: mtime,
			Format:  tar.FormatPAX,
		}
		switch {
		case e.dir:
			h.Typeflag, h.Name = tar.TypeDir, e.path+"/"
		case e.link != "":
			h.Typeflag, h.Linkname = tar.TypeSymlink, e.link
		default:
			h.Typeflag, h.Size = tar.TypeReg, int64(len(e.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	blob := gz.Bytes()
	// the opener hands out the gzip bytes as they are: the layer's digest is of exactly these bytes
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(blob)), nil },
		tarball.WithMediaType(types.OCILayer))
}
