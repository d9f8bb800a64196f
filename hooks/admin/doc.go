// Package admin holds nothing itself: its packages run on the admin's own machine.
//   - admincli: the `kube-gpu-stack` command (the in-cluster commands plus those below);
//   - placementplan: `plan`, what a values change will do where; fleetview: several clusters at once;
//   - gpumigrate: `migrate`, GPU Operator settings into values; schemahint: did-you-mean for schema errors;
//   - airgap: bundles and mirrors for clusters without internet; imagebuild: the project's image without Docker;
//   - terminal: whether output goes to a terminal.
package admin
