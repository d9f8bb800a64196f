// Package runtimeconfig gives the container runtime's main config back as it was before the container toolkit
// changed it. The toolkit's installer (upstream's) imports its drop-in into the runtime's main config and, when it
// stops, removes the drop-in but leaves the import (and the version key it may have added), and leaves its CDI spec
// for management containers. A Keeper, started before the toolkit on the node (the toolkit pod's native sidecar),
// records the main config's bytes; stopped after the toolkit (a native sidecar stops after the pod's containers), it
// writes those bytes back when the config differs from them only by what the toolkit adds, and removes the spec. A
// config that someone else changed meanwhile is left as it is, and the log says what to remove by hand.
package runtimeconfig

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"

	"github.com/BurntSushi/toml"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/atomicfile"
)

// Keeper keeps one runtime config.
type Keeper struct {
	// Config is the runtime's main config as this container sees it; empty when the toolkit changes none (NRI).
	Config string
	// DropIn is the drop-in's path on the host, as the toolkit imports it (RUNTIME_DROP_IN_CONFIG_HOST_PATH).
	DropIn string
	// State is the file that keeps the config as it was, on a host folder that outlives the pod.
	State string
	// Specs are the CDI specs the toolkit writes at its start, removed at the stop.
	Specs []string
	Log   *slog.Logger
}

// record is State's content.
type record struct {
	// Path is the config this record is of (a changed --config makes a record of another file useless).
	Path string `json:"path"`
	// Existed says whether the config was there; Content is its bytes then.
	Existed bool   `json:"existed"`
	Content string `json:"content"`
	Mode    uint32 `json:"mode,omitempty"`
}

// Keep records the config as it is now, unless a record of it is there already: that one was taken before a
// toolkit changed the config (this pod's container restarted, or a pod before it stopped without its restore).
func (k Keeper) Keep() error {
	if k.Config == "" {
		return nil
	}
	if rec, err := k.read(); err == nil && rec != nil && rec.Path == k.Config {
		k.Log.Info("the runtime config's earlier record stays: it was taken before the toolkit changed the config", "state", k.State)
		return nil
	}
	rec := record{Path: k.Config}
	info, err := os.Stat(k.Config)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return fmt.Errorf("runtime config %s: %w", k.Config, err)
	default:
		raw, err := os.ReadFile(k.Config)
		if err != nil {
			return fmt.Errorf("runtime config %s: %w", k.Config, err)
		}
		rec.Existed, rec.Content, rec.Mode = true, string(raw), uint32(info.Mode().Perm())
	}
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if err := atomicfile.Write(k.State, data, 0o600); err != nil {
		return fmt.Errorf("record the runtime config %s in %s: %w", k.Config, k.State, err)
	}
	k.Log.Info("recorded the runtime config before the toolkit", "config", k.Config, "existed", rec.Existed, "state", k.State)
	return nil
}

// Restore removes the toolkit's CDI specs and gives the config its recorded bytes back when it differs from them
// only by what the toolkit adds: the import of its drop-in, and a version key the record lacked. Otherwise it
// leaves the config and says what differs. The record goes either way; an unreadable record changes nothing.
func (k Keeper) Restore() error {
	var errs []error
	for _, spec := range k.Specs {
		if err := os.Remove(spec); err == nil {
			k.Log.Info("removed the toolkit's CDI spec", "spec", spec)
		} else if !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove the toolkit's CDI spec: %w", err))
		}
	}
	if k.Config == "" {
		return errors.Join(errs...)
	}
	rec, err := k.read()
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	if rec == nil || rec.Path != k.Config {
		k.Log.Info("no record of the runtime config from before the toolkit: it stays as it is", "config", k.Config, "state", k.State)
		return errors.Join(errs...)
	}
	if err := k.restore(*rec); err != nil {
		return errors.Join(append(errs, err)...)
	}
	if err := os.Remove(k.State); err != nil && !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (k Keeper) restore(rec record) error {
	now, err := os.ReadFile(k.Config)
	exists := err == nil
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("runtime config %s: %w", k.Config, err)
	}
	if exists == rec.Existed && string(now) == rec.Content {
		k.Log.Info("the runtime config is as it was before the toolkit", "config", k.Config)
		return nil
	}
	if !exists {
		k.Log.Info("the runtime config is gone: nothing to give back", "config", k.Config, "existed before", rec.Existed)
		return nil
	}
	if diff := k.beyondToolkit(now, rec); diff != "" {
		k.Log.Warn("the runtime config changed beyond the toolkit's import since the toolkit started: left as it is; "+
			"remove the import of the toolkit's drop-in by hand if it is no longer wanted", "config", k.Config, "dropIn", k.DropIn, "differs", diff)
		return nil
	}
	if !rec.Existed {
		if err := os.Remove(k.Config); err != nil {
			return fmt.Errorf("remove the runtime config %s the toolkit created: %w", k.Config, err)
		}
		k.Log.Info("removed the runtime config the toolkit created", "config", k.Config)
		return nil
	}
	if err := atomicfile.Write(k.Config, []byte(rec.Content), fs.FileMode(rec.Mode)); err != nil {
		return fmt.Errorf("give the runtime config %s its bytes from before the toolkit: %w", k.Config, err)
	}
	k.Log.Info("gave the runtime config its bytes from before the toolkit", "config", k.Config)
	return nil
}

// beyondToolkit says how now differs from the record beyond the toolkit's own change ("" when it does not): parsed
// as TOML, without the import of the drop-in (by its path or its folder's *.toml) and, when the record had none,
// without a version key, now must equal the record.
func (k Keeper) beyondToolkit(now []byte, rec record) string {
	var cur, before map[string]any
	if err := toml.Unmarshal(now, &cur); err != nil {
		return fmt.Sprintf("not TOML now: %v", err)
	}
	if rec.Existed {
		if err := toml.Unmarshal([]byte(rec.Content), &before); err != nil {
			return fmt.Sprintf("not TOML before: %v", err)
		}
	}
	if before == nil {
		before = map[string]any{}
	}
	toolkits := []string{k.DropIn, filepath.Join(filepath.Dir(k.DropIn), "*.toml")}
	if imports, ok := cur["imports"].([]any); ok {
		kept := slices.DeleteFunc(slices.Clone(imports), func(v any) bool {
			s, ok := v.(string)
			return ok && slices.Contains(toolkits, s)
		})
		if _, had := before["imports"]; len(kept) == 0 && !had {
			delete(cur, "imports")
		} else {
			cur["imports"] = kept
		}
	}
	if _, had := before["version"]; !had {
		delete(cur, "version")
	}
	for _, m := range []map[string]any{cur, before} {
		for _, key := range slices.Sorted(maps.Keys(m)) {
			if !reflect.DeepEqual(cur[key], before[key]) {
				return "key " + key
			}
		}
	}
	return ""
}

// read returns State's record; nil when there is none.
func (k Keeper) read() (*record, error) {
	raw, err := os.ReadFile(k.State)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("the runtime config's record %s: %w", k.State, err)
	}
	var rec record
	if err := json.Unmarshal(raw, &rec); err != nil || rec.Path == "" {
		return nil, fmt.Errorf("the runtime config's record %s is not one (%v): the config stays as it is; delete the file", k.State, err)
	}
	return &rec, nil
}
