package gpumigrate

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"k8s.io/client-go/dynamic"
)

// Options of `kube-gpu-stack migrate`.
type Options struct {
	// File is a GPU Operator values file, or YAML with a ClusterPolicy and NVIDIADriver objects.
	File string
	// FromCluster reads the ClusterPolicy, the NVIDIADrivers and the node labels through Dynamic.
	FromCluster bool
	Dynamic     dynamic.Interface
	// Server is the address Dynamic reads, named in its errors: the kubeconfig may point at another cluster.
	Server string
	// FromVersion is the GPU Operator release the values come from, whose defaults are dropped ("": recognise them).
	FromVersion string
	// Kernels are the GPU nodes' kernels for precompiled drivers, added to those --from-cluster finds.
	Kernels []string
	// Out is the values file to write ("" or "-": standard output).
	Out string
	// Report is the report file ("": standard output, or standard error when the values go there).
	Report string
	// Stderr receives the report when both would go to standard output.
	Stderr io.Writer
}

// Validate checks that there is something to read.
func (o *Options) Validate() error {
	if o.File == "" && !o.FromCluster {
		return errors.New("give a GPU Operator values file (-f) or --from-cluster")
	}
	if o.FromCluster && o.Dynamic == nil {
		return errors.New("--from-cluster needs a cluster client")
	}
	if o.FromVersion != "" {
		if _, err := CheckVersion(o.FromVersion); err != nil {
			return err
		}
	}
	return nil
}

// source is the release --from-version names, else the one the values' defaults are recognised as.
func (o *Options) source(values map[string]any) (Source, error) {
	if o.FromVersion == "" {
		return Recognise(values), nil
	}
	tag, err := CheckVersion(o.FromVersion)
	if err != nil {
		return Source{}, err
	}
	return FromVersion(tag, values), nil
}

// Run converts and writes the values and the report.
func (o *Options) Run(ctx context.Context, stdout io.Writer) (Result, error) {
	var (
		r       Result
		cluster Cluster
		sources []string
	)
	if o.FromCluster {
		var err error
		if cluster, err = FromCluster(ctx, o.Dynamic); err != nil {
			return r, fmt.Errorf("--from-cluster, the cluster at %s: %w", o.Server, err)
		}
		sources = append(sources, "the cluster's ClusterPolicy "+cluster.Policy+" and NVIDIADrivers")
	}
	if o.File != "" {
		data, err := os.ReadFile(o.File)
		if err != nil {
			return r, err
		}
		in, err := ParseFile(data)
		if err != nil {
			return r, fmt.Errorf("%s: %w", o.File, err)
		}
		// the file's values refine the cluster's
		if cluster.Values == nil {
			cluster.Values = map[string]any{}
		}
		mergeMaps(cluster.Values, in.Values)
		cluster.Drivers = append(cluster.Drivers, in.Drivers...)
		sources = append(sources, o.File)
	}
	cluster.Kernels = append(cluster.Kernels, o.Kernels...)
	src, err := o.source(cluster.Values)
	if err != nil {
		return r, err
	}
	r = ConvertClusterFrom(cluster, src)

	valuesOut, reportOut := stdout, stdout
	if o.Out != "" && o.Out != "-" {
		f, err := os.Create(o.Out)
		if err != nil {
			return r, err
		}
		defer f.Close()
		valuesOut = f
	} else if o.Stderr != nil {
		reportOut = o.Stderr
	}
	if err := WriteValues(valuesOut, r, strings.Join(sources, " and ")); err != nil {
		return r, err
	}
	if f, ok := valuesOut.(*os.File); ok && f != os.Stdout {
		if err := f.Close(); err != nil {
			return r, err
		}
	}
	if o.Report != "" {
		f, err := os.Create(o.Report)
		if err != nil {
			return r, err
		}
		defer f.Close()
		if err := WriteReport(f, r); err != nil {
			return r, err
		}
		return r, f.Close()
	}
	return r, WriteReport(reportOut, r)
}
