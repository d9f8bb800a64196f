// Package nodestatetest gives a fake clientset's Nodes what the fake lacks and the stack relies on: optimistic
// concurrency. client-go's object tracker ignores metadata.resourceVersion on updates and patches, so a test of
// "a write computed from a stale read is refused" needs a server that refuses it; Versioned makes the fake one.
package nodestatetest

import (
	"encoding/json"
	"errors"
	"strconv"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

var nodesGVR = corev1.SchemeGroupVersion.WithResource("nodes")

// Versions stamps the fake's nodes with resource versions, as the API server does.
type Versions struct {
	c  *fake.Clientset
	mu sync.Mutex
	rv int
	// Conflicts counts the writes refused for a stale resourceVersion.
	Conflicts int
}

// Versioned makes the fake's node writes behave as the API server's: every write gives the node a new
// metadata.resourceVersion, and an update, or a patch that carries metadata.resourceVersion, whose version is not
// the node's current one is refused with 409 Conflict. The nodes already in the fake are stamped now.
func Versioned(c *fake.Clientset) *Versions {
	v := &Versions{c: c, rv: 100}
	list, err := c.Tracker().List(nodesGVR, corev1.SchemeGroupVersion.WithKind("Node"), "")
	if err == nil {
		for _, n := range list.(*corev1.NodeList).Items {
			v.rv++
			n.ResourceVersion = strconv.Itoa(v.rv)
			_ = c.Tracker().Update(nodesGVR, &n, "")
		}
	}
	react := k8stesting.ObjectReaction(c.Tracker())
	c.PrependReactor("*", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		var want, name string
		switch a := a.(type) {
		case k8stesting.PatchActionImpl:
			var doc struct {
				Metadata struct {
					ResourceVersion string `json:"resourceVersion"`
				} `json:"metadata"`
			}
			_ = json.Unmarshal(a.GetPatch(), &doc)
			want, name = doc.Metadata.ResourceVersion, a.GetName()
		case k8stesting.UpdateActionImpl:
			n := a.GetObject().(*corev1.Node)
			want, name = n.ResourceVersion, n.Name
		case k8stesting.CreateActionImpl:
		default:
			return false, nil, nil
		}
		v.mu.Lock()
		defer v.mu.Unlock()
		if want != "" {
			cur, err := c.Tracker().Get(nodesGVR, "", name)
			if err != nil {
				return true, nil, err
			}
			if cur.(*corev1.Node).ResourceVersion != want {
				v.Conflicts++
				return true, nil, apierrors.NewConflict(nodesGVR.GroupResource(), cur.(*corev1.Node).Name,
					errors.New("the object has been modified; please apply your changes to the latest version and try again"))
			}
		}
		handled, obj, err := react(a)
		if err != nil || obj == nil {
			return handled, obj, err
		}
		n := obj.(*corev1.Node).DeepCopy()
		v.rv++
		n.ResourceVersion = strconv.Itoa(v.rv)
		if err := c.Tracker().Update(nodesGVR, n, ""); err != nil {
			return true, nil, err
		}
		return true, n, nil
	})
	return v
}

// Edit changes the node as another client (an admin) would, between the stack's read and its write: it is meant
// to be called from a reactor, which runs with the fake's lock held, so it goes to the tracker directly.
func (v *Versions) Edit(name string, change func(*corev1.Node)) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	cur, err := v.c.Tracker().Get(nodesGVR, "", name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	n := cur.(*corev1.Node).DeepCopy()
	change(n)
	v.rv++
	n.ResourceVersion = strconv.Itoa(v.rv)
	return v.c.Tracker().Update(nodesGVR, n, "")
}
