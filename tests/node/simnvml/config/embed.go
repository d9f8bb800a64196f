package config

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
)

// embedMagic ends a library file that carries its config: after the library's bytes come the config's JSON, its
// length (8 bytes, little-endian) and this. The dynamic loader maps only what the ELF headers name, so the
// trailer changes nothing for it.
var embedMagic = []byte("simnvml-config-1")

const trailerSize = 8 + 16

// Embed writes the library at library, followed by c, to out (mode 0755): a library that carries its own config.
// It is for where only the library's file travels: the container toolkit's CDI spec and legacy hook mount the
// driver's libraries one file at a time, without a simnvml.json beside them.
func (c Config) Embed(library, out string) error {
	if err := c.Validate(); err != nil {
		return err
	}
	lib, err := os.ReadFile(library)
	if err != nil {
		return err
	}
	if _, ok, err := embedded(bytes.NewReader(lib), int64(len(lib))); err != nil || ok {
		return fmt.Errorf("%s already carries a config (%v): embed into the library as built", library, err)
	}
	js, err := json.Marshal(c)
	if err != nil {
		return err
	}
	var b bytes.Buffer
	b.Write(lib)
	b.Write(js)
	binary.Write(&b, binary.LittleEndian, uint64(len(js)))
	b.Write(embedMagic)
	return os.WriteFile(out, b.Bytes(), 0o755)
}

// ReadEmbedded reads the config the library file at path carries; ok is false when it carries none.
func ReadEmbedded(path string) (c Config, ok bool, err error) {
	f, err := os.Open(path)
	if err != nil {
		return Config{}, false, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return Config{}, false, err
	}
	c, ok, err = embedded(f, st.Size())
	if err != nil {
		return Config{}, false, fmt.Errorf("%s: the config it carries: %w", path, err)
	}
	return c, ok, nil
}

func embedded(r io.ReaderAt, size int64) (Config, bool, error) {
	if size < trailerSize {
		return Config{}, false, nil
	}
	trailer := make([]byte, trailerSize)
	if _, err := r.ReadAt(trailer, size-trailerSize); err != nil {
		return Config{}, false, err
	}
	if !bytes.Equal(trailer[8:], embedMagic) {
		return Config{}, false, nil
	}
	n := binary.LittleEndian.Uint64(trailer[:8])
	if n > uint64(size-trailerSize) {
		return Config{}, false, errors.New("its length runs past the file's start")
	}
	js := make([]byte, n)
	if _, err := r.ReadAt(js, size-trailerSize-int64(n)); err != nil {
		return Config{}, false, err
	}
	c, err := decode(js)
	return c, err == nil, err
}
