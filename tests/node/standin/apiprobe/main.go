// Command apiprobe reaches the API server as every in-cluster client does (KUBERNETES_SERVICE_HOST/PORT, the
// service account's token and CA) and asks who it is: the test node's pods can talk to the control plane, and the
// API server accepts their token.
package main

import (
	"context"
	"fmt"
	"os"

	authv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

func main() {
	cfg, err := rest.InClusterConfig()
	if err != nil {
		fmt.Fprintln(os.Stderr, "in-cluster config:", err)
		os.Exit(1)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	review, err := client.AuthenticationV1().SelfSubjectReviews().Create(context.Background(), &authv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "self subject review:", err)
		os.Exit(1)
	}
	fmt.Printf("%s from uid %d through %s\n", review.Status.UserInfo.Username, os.Getuid(), cfg.Host)
}
