// Package kube holds nothing itself: its packages are the Kubernetes helpers every other group shares.
//   - apiretry: retry of API errors that may pass; kwatch: a watched copy of API objects;
//   - schedule: "may this pod template run on this node", with the scheduler's helpers; placement: which operand
//     DaemonSet runs on which node of a rendered chart;
//   - gpupods: the one definition of a GPU pod.
package kube
