package tests

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// TestValidatorChecksMayRecordOnTheirNode: a validator check that knows its node (NODE_NAME) records its outcome
// there, so its pod's ServiceAccount must be allowed to get and patch Nodes; a check without NODE_NAME records
// nothing and needs no rule. The API refuses a patch a rule does not allow only on a running node, where it is a
// logged, lost explanation: this catches it at render.
func TestValidatorChecksMayRecordOnTheirNode(t *testing.T) {
	checked := 0
	for _, p := range profiles(t) {
		objs := objects(t, render(t, newestKube, []string{p.file}, everythingOn...))
		may := nodeVerbsByServiceAccount(objs)
		for _, o := range objs {
			for where, ps := range podSpecs(o) {
				sa, _ := ps["serviceAccountName"].(string)
				for _, c := range containersOf(ps) {
					if !recordsOnNode(c) {
						continue
					}
					checked++
					for _, verb := range []string{"get", "patch"} {
						if !may[sa][verb] {
							t.Errorf("%s: %s container %s records its check on the Node (NODE_NAME set) but ServiceAccount %q may not %s nodes",
								p.name, where, c["name"], sa, verb)
						}
					}
				}
			}
		}
	}
	if checked == 0 {
		t.Fatal("no validator check that records on its Node was found: is the command matched?")
	}
}

// recordsOnNode: the container runs a validator check (not the status-file helpers) with NODE_NAME set.
func recordsOnNode(c map[string]any) bool {
	cmd, _ := c["command"].([]any)
	if len(cmd) < 2 || cmd[0] != "validator" || slices.Contains([]any{"wait", "cleanup", "ready", "metrics"}, cmd[1]) {
		return false
	}
	env, _ := c["env"].([]any)
	return slices.ContainsFunc(env, func(e any) bool { m, _ := e.(map[string]any); return m["name"] == "NODE_NAME" })
}

// nodeVerbsByServiceAccount: the verbs on core nodes each ServiceAccount gets through the rendered ClusterRoles.
func nodeVerbsByServiceAccount(objs []object) map[string]map[string]bool {
	verbs := map[string][]string{}
	for _, o := range objs {
		if o.kind() != "ClusterRole" {
			continue
		}
		rules, _ := o.Raw["rules"].([]any)
		for _, r := range rules {
			rule, _ := r.(map[string]any)
			if has(rule["apiGroups"], "") && has(rule["resources"], "nodes") {
				for _, v := range rule["verbs"].([]any) {
					verbs[o.name()] = append(verbs[o.name()], fmt.Sprint(v))
				}
			}
		}
	}
	out := map[string]map[string]bool{}
	for _, o := range objs {
		if o.kind() != "ClusterRoleBinding" {
			continue
		}
		ref, _ := o.Raw["roleRef"].(map[string]any)
		subjects, _ := o.Raw["subjects"].([]any)
		for _, s := range subjects {
			sub, _ := s.(map[string]any)
			if sub["kind"] != "ServiceAccount" {
				continue
			}
			name := fmt.Sprint(sub["name"])
			if out[name] == nil {
				out[name] = map[string]bool{}
			}
			for _, v := range verbs[fmt.Sprint(ref["name"])] {
				out[name][v] = true
			}
		}
	}
	return out
}

func has(list any, want string) bool {
	l, _ := list.([]any)
	return slices.ContainsFunc(l, func(x any) bool { return strings.EqualFold(fmt.Sprint(x), want) || fmt.Sprint(x) == "*" })
}
