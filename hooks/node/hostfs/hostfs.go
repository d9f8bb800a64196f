// Package hostfs reads another filesystem through the directory its root is mounted at: the host's "/" at /host,
// the containerized driver's root at /run/nvidia/driver, or a fixture tree in tests. Symlinks are resolved inside
// that root (an absolute link on the host points into the host, never into this container), so the same code
// works in a pod and against t.TempDir().
package hostfs

import (
	"bufio"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	securejoin "github.com/cyphar/filepath-securejoin"
)

// BinDirs are the directories, relative to a root, where a driver installs nvidia-smi (the last two: WSL and
// read-only-/usr distributions such as Flatcar).
var BinDirs = []string{"usr/bin", "usr/sbin", "bin", "sbin", "usr/lib/wsl/lib", "opt/bin"}

// LibDirs are the directories, relative to a root, where a driver installs its user-space libraries
// (libnvidia-ml.so.1), in the order the dynamic linker of the usual distributions would find them.
var LibDirs = []string{
	"usr/lib64", "usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu", "lib64", "lib/x86_64-linux-gnu",
	"lib/aarch64-linux-gnu", "usr/lib", "lib", "usr/lib/wsl/lib",
}

// Root is the directory another filesystem's "/" is mounted at.
type Root string

// String is the root's path in this container.
func (r Root) String() string { return string(r) }

// Path returns where p (a path on the other filesystem) is in this container, its symlinks resolved inside the
// root. A missing file is not an error here: the caller's Stat or Open says so.
func (r Root) Path(p string) (string, error) {
	root := filepath.Clean(string(r))
	resolved, err := securejoin.SecureJoin(root, p)
	if err != nil {
		return "", fmt.Errorf("resolve %s under %s: %w", p, root, err)
	}
	return resolved, nil
}

// FindExecutable returns the first of dirs (relative to the root) holding an executable regular file name, as
// that directory and the file's path in this container. fs.ErrNotExist when no directory has one.
func (r Root) FindExecutable(name string, dirs []string) (dir, path string, err error) {
	for _, d := range dirs {
		p, err := r.Path(filepath.Join(d, name))
		if err != nil {
			return "", "", err
		}
		fi, err := os.Stat(p)
		if err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
			return d, p, nil
		}
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return "", "", fmt.Errorf("check %s: %w", p, err)
		}
	}
	return "", "", fmt.Errorf("no executable %s under %s in %s: %w", name, r, strings.Join(dirs, ", "), os.ErrNotExist)
}

// FindLibrary returns the path in this container of the shared library name in the root's LibDirs.
// fs.ErrNotExist when none has it.
func (r Root) FindLibrary(name string) (string, error) {
	for _, d := range LibDirs {
		p, err := r.Path(filepath.Join(d, name))
		if err != nil {
			return "", err
		}
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			return p, nil
		}
	}
	return "", fmt.Errorf("no %s under %s in %s: %w", name, r, strings.Join(LibDirs, ", "), os.ErrNotExist)
}

// LoadedModules returns the kernel modules listed in the root's proc/modules (the host's /proc, mounted with the
// host root).
func (r Root) LoadedModules() (map[string]bool, error) {
	p, err := r.Path("proc/modules")
	if err != nil {
		return nil, err
	}
	f, err := os.Open(p)
	if err != nil {
		return nil, fmt.Errorf("read loaded kernel modules: %w", err)
	}
	defer f.Close()
	mods := map[string]bool{}
	s := bufio.NewScanner(f)
	for s.Scan() {
		if name, _, _ := strings.Cut(s.Text(), " "); name != "" {
			mods[name] = true
		}
	}
	if err := s.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", p, err)
	}
	return mods, nil
}

// Exists reports whether p exists in the root (symlinks followed inside it).
func (r Root) Exists(p string) (bool, error) {
	full, err := r.Path(p)
	if err != nil {
		return false, err
	}
	_, err = os.Stat(full)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, os.ErrNotExist):
		return false, nil
	}
	return false, fmt.Errorf("check %s: %w", full, err)
}

// ReadDirNames returns the names in directory p of the root; a missing directory has none.
func (r Root) ReadDirNames(p string) ([]string, error) {
	full, err := r.Path(p)
	if err != nil {
		return nil, err
	}
	entries, err := os.ReadDir(full)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", full, err)
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names, nil
}

// Interpreter returns the ELF interpreter (PT_INTERP) a program names, such as /lib64/ld-linux-x86-64.so.2; ""
// for a static program, or one that is not ELF (a script: the kernel runs the interpreter its #! line names).
func Interpreter(path string) (string, error) {
	magic := make([]byte, len(elf.ELFMAG))
	r, err := os.Open(path)
	if err != nil {
		return "", err
	}
	_, err = io.ReadFull(r, magic)
	r.Close()
	if err != nil || string(magic) != elf.ELFMAG {
		return "", nil
	}
	f, err := elf.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b, err := io.ReadAll(p.Open())
			if err != nil {
				return "", fmt.Errorf("read %s's interpreter: %w", path, err)
			}
			return strings.TrimRight(string(b), "\x00"), nil
		}
	}
	return "", nil
}
