package placementplan

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/gpupods"
)

// Cluster is what plan reads of a cluster: its nodes and, when known, its pods and PodDisruptionBudgets.
type Cluster struct {
	Nodes []*corev1.Node
	// PodsKnown: Pods and PDBs were read (a live cluster, or --pods); without them a driver change is unknown.
	PodsKnown bool
	Pods      []*corev1.Pod
	PDBs      []policyv1.PodDisruptionBudget
	// GPU decides which pods use GPUs (gpupods), reading claims from the cluster or the ones given.
	GPU *gpupods.Checker
	// TemplateChanged says which of the release's DaemonSets and Deployments replace their pods (TemplateChanges);
	// nil when not known (files), and then only the driver's and the placements' restarts are predicted.
	TemplateChanged map[string]bool
}

// Read lists the cluster's nodes, pods and PodDisruptionBudgets; resource claims are listed only for namespaces
// with a pod that has claims (gpupods.Checker). It only reads.
func Read(ctx context.Context, client kubernetes.Interface) (*Cluster, error) {
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	pods, err := client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list pods: %w", err)
	}
	pdbs, err := client.PolicyV1().PodDisruptionBudgets(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list PodDisruptionBudgets: %w", err)
	}
	c := &Cluster{PodsKnown: true, PDBs: pdbs.Items, GPU: &gpupods.Checker{Client: client}}
	for i := range nodes.Items {
		c.Nodes = append(c.Nodes, &nodes.Items[i])
	}
	for i := range pods.Items {
		c.Pods = append(c.Pods, &pods.Items[i])
	}
	return c, nil
}

// ReadFiles reads Node objects from nodesFile and, when podsFile is set, Pods, PodDisruptionBudgets and
// ResourceClaims from it: each a List (kubectl get -o yaml) or YAML/JSON documents; other kinds are skipped.
func ReadFiles(nodesFile, podsFile string) (*Cluster, error) {
	c := &Cluster{}
	var claims []resourcev1.ResourceClaim
	add := func(u *unstructured.Unstructured) error {
		var err error
		switch u.GetKind() {
		case "Node":
			n := &corev1.Node{}
			err = runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, n)
			c.Nodes = append(c.Nodes, n)
		case "Pod":
			p := &corev1.Pod{}
			err = runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, p)
			c.Pods = append(c.Pods, p)
		case "PodDisruptionBudget":
			var pdb policyv1.PodDisruptionBudget
			err = runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &pdb)
			c.PDBs = append(c.PDBs, pdb)
		case "ResourceClaim":
			var cl resourcev1.ResourceClaim
			err = runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &cl)
			claims = append(claims, cl)
		}
		if err != nil {
			return fmt.Errorf("%s %s: %w", u.GetKind(), u.GetName(), err)
		}
		return nil
	}
	if err := readObjects(nodesFile, add); err != nil {
		return nil, err
	}
	if len(c.Nodes) == 0 {
		return nil, fmt.Errorf("%s holds no Node object", nodesFile)
	}
	if podsFile != "" {
		c.PodsKnown = true
		if err := readObjects(podsFile, add); err != nil {
			return nil, err
		}
	}
	c.GPU = gpupods.NewOffline(claims)
	return c, nil
}

func readObjects(file string, add func(*unstructured.Unstructured) error) error {
	raw, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(raw), 4096)
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return fmt.Errorf("%s: %w", file, err)
		}
		if len(u.Object) == 0 {
			continue
		}
		if strings.HasSuffix(u.GetKind(), "List") {
			list, err := u.ToList()
			if err != nil {
				return fmt.Errorf("%s: %w", file, err)
			}
			for i := range list.Items {
				if err := add(&list.Items[i]); err != nil {
					return fmt.Errorf("%s: %w", file, err)
				}
			}
			continue
		}
		if err := add(u); err != nil {
			return fmt.Errorf("%s: %w", file, err)
		}
	}
}
