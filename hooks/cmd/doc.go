// Package cmd holds nothing itself: its folders are the two binaries' mains, in-cluster (the project image's one
// binary: the node commands and the release hooks) and kube-gpu-stack (the admin's CLI), and incluster, the image's
// table of command names that its main and the image build share.
package cmd
