package admission

import (
	"context"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/release/refusal"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/release/stackcli"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/revertset"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
)

// The hooks' accounts, as kube-gpu-stack.hookNames names them: the pre-upgrade plan and the post-upgrade gate.
const (
	planSA = "kube-gpu-stack-pre-upgrade"
	gateSA = "kube-gpu-stack-validation-gate"
)

// hookTestDaemonSet is a DaemonSet of component and release instance, running account sa.
func hookTestDaemonSet(name, component, instance, sa string) *appsv1.DaemonSet {
	sel := map[string]string{"app.kubernetes.io/name": name}
	return &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
			Labels: map[string]string{"app.kubernetes.io/name": name, "app.kubernetes.io/instance": instance, "app.kubernetes.io/component": component}},
		Spec: appsv1.DaemonSetSpec{Selector: &metav1.LabelSelector{MatchLabels: sel},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: sel},
				Spec: corev1.PodSpec{ServiceAccountName: sa, Containers: []corev1.Container{{Name: "c", Image: "example.invalid/none"}}}}},
	}
}

// TestHooksCreateAndDeleteOnlyTheReleasesDriverDaemonSets: the plan's and the gate's Roles may create or delete any
// DaemonSet in the privileged namespace; with their real tokens, the admission policy refuses every DaemonSet but the
// release's driver and vGPU manager ones, and a creation that is not a revert copy of one, and lets through what the
// code does: a left-over driver DaemonSet deleted, a revert copy created (revertset.Build) and deleted.
func TestHooksCreateAndDeleteOnlyTheReleasesDriverDaemonSets(t *testing.T) {
	install(t)
	ctx := t.Context()
	admin := kube.Client.AppsV1().DaemonSets(ns)
	create := func(d *appsv1.DaemonSet) *appsv1.DaemonSet {
		t.Helper()
		got, err := admin.Create(ctx, d, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	release := chartrender.ReleaseName
	deviceplugin := create(hookTestDaemonSet("hooktest-device-plugin", "device-plugin", release, "nvidia-device-plugin"))
	otherRelease := create(hookTestDaemonSet("hooktest-driver-other", "driver", "other", driverSA))
	refused, allowed := 0, 0
	for _, sa := range []string{planSA, gateSA} {
		c := clientAs(t, sa, nil).AppsV1().DaemonSets(ns)
		for _, d := range []*appsv1.DaemonSet{deviceplugin, otherRelease} {
			err := refusedByPolicy(t, func(ctx context.Context) error { return c.Delete(ctx, d.Name, metav1.DeleteOptions{}) })
			if !strings.Contains(err.Error(), "may create or delete only the driver and vGPU manager DaemonSets of release "+release) {
				t.Errorf("%s deleting %s: %v", sa, d.Name, err)
			}
			refused++
		}
		leftOver := create(hookTestDaemonSet("hooktest-driver-left-over-"+sa[len("kube-gpu-stack-"):], "driver", release, driverSA))
		if err := c.Delete(ctx, leftOver.Name, metav1.DeleteOptions{}); err != nil {
			t.Errorf("%s deleting the release's left-over driver DaemonSet: %v", sa, err)
		}
		allowed++
	}

	plan := clientAs(t, planSA, nil).AppsV1().DaemonSets(ns)
	driver := create(hookTestDaemonSet("hooktest-driver", "driver", release, driverSA))
	const digest = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	notACopy := hookTestDaemonSet("hooktest-driver-extra", "driver", release, driverSA)
	anotherAccount := revertset.Build(driver, digest)
	anotherAccount.Spec.Template.Spec.ServiceAccountName = "nvidia-device-plugin"
	orphan := revertset.Build(driver, digest)
	orphan.OwnerReferences = nil
	for what, d := range map[string]*appsv1.DaemonSet{"a DaemonSet that copies none": notACopy, "a copy running another account": anotherAccount,
		"a copy owned by no DaemonSet": orphan, "a copy of the device plugin's": revertset.Build(deviceplugin, digest)} {
		err := refusedByPolicy(t, func(ctx context.Context) error {
			_, err := plan.Create(ctx, d, metav1.CreateOptions{})
			return err
		})
		if !strings.Contains(err.Error(), "may create") {
			t.Errorf("%s: %v", what, err)
		}
		refused++
	}
	copied, err := plan.Create(ctx, revertset.Build(driver, digest), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("the plan creating a revert copy of the release's driver DaemonSet: %v", err)
	}
	if err := plan.Delete(ctx, copied.Name, metav1.DeleteOptions{}); err != nil {
		t.Errorf("the plan deleting a revert copy no node needs: %v", err)
	}
	allowed += 2
	t.Logf("hook accounts' DaemonSet requests: %d refused by the policy, %d allowed", refused, allowed)
}

// TestPlanRecordsItsRefusalOnItsOwnJobOnly: the pre-upgrade plan's account, with its real token and the rendered
// RBAC, records a refusal on its own Job (the Job read, the Event created) and may read no other Job.
func TestPlanRecordsItsRefusalOnItsOwnJobOnly(t *testing.T) {
	install(t)
	ctx := t.Context()
	jobs := kube.Client.BatchV1().Jobs(ns)
	for _, name := range []string{stackcli.PreUpgradeJob, gateSA} {
		j := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{
			Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{Name: "c", Image: "registry.example/c"}}}}}}
		if _, err := jobs.Create(ctx, j, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	plan := clientAs(t, planSA, nil)
	if err := refusal.Record(ctx, plan, ns, stackcli.PreUpgradeJob, "driver upgrade refused, nothing changed: a test", time.Now()); err != nil {
		t.Fatalf("the plan's account recording its refusal: %v", err)
	}
	if ev, err := refusal.Last(ctx, kube.Client, ns, stackcli.PreUpgradeJob); err != nil || ev == nil {
		t.Errorf("the recorded refusal: %v, %v", ev, err)
	}
	if _, err := plan.BatchV1().Jobs(ns).Get(ctx, gateSA, metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the plan's account reading another Job: %v; want forbidden", err)
	}
}
