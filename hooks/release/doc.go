// Package release holds nothing itself: its packages are the release-level hooks, the Jobs Helm runs for a release.
//   - upgradeplan: the pre-upgrade (and pre-rollback) plan of a driver change, and `upgrade status`;
//   - releasecheck: the post-install and post-upgrade check that the release works;
//   - releasecleanup: the pre-delete cleanup of what the release put on nodes;
//   - refusal: a hook's refusal, recorded where helm and kubectl users look;
//   - stackcli: the in-cluster `kube-gpu-stack` command that runs them, and the admin's views of them.
package release
