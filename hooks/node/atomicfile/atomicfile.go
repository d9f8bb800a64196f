// Package atomicfile writes a file whole or not at all: the data goes to a temporary file beside it, which is
// synced and then renamed over the path, so a reader (a shell sourcing a status file, containerd reading its config,
// an admin running helm) never sees half of it, and a crash mid-write leaves the old file.
package atomicfile

import (
	"io/fs"
	"os"
	"path/filepath"
)

// Write puts data at path with mode. The temporary file (.<name>.partial-*, in path's folder) is removed on any
// failure.
func Write(path string, data []byte, mode fs.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".partial-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // a no-op after the rename
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(mode); err != nil { // CreateTemp makes it 0600
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
