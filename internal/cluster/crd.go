package cluster

import (
	"context"
	"fmt"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

// CreateCRD creates crd, or keeps the one of that name already there (created false), and waits up to 30 s until
// the API server serves it (Established).
func (c *Cluster) CreateCRD(ctx context.Context, crd *apiextensionsv1.CustomResourceDefinition) (created bool, err error) {
	ext, err := apiextensionsclient.NewForConfig(c.Config)
	if err != nil {
		return false, err
	}
	_, err = ext.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, crd, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return false, fmt.Errorf("create CRD %s: %w", crd.Name, err)
	}
	created = err == nil
	var last string
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		got, err := ext.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, crd.Name, metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		for _, cond := range got.Status.Conditions {
			if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
				return true, nil
			}
		}
		last = "not established"
		return false, nil
	})
	if err != nil {
		return created, fmt.Errorf("CRD %s never established (%s): %w", crd.Name, last, err)
	}
	return created, nil
}
