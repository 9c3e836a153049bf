// Command demo installs sandbox-executor on the local cluster as a user does (the Helm chart
// with the project's images, the runner in a pod with gitlab-runner 17.9.0; tests/harness/chartinstall),
// runs a Duo-shaped job (GitLab Duo Agent Platform flow) through it against a stand-in GitLab
// instance on the network job pods may reach (tools/duoflow), reached by a cluster DNS name,
// prints the job log as GitLab would show it and the commit the job pushed, and uninstalls.
// `make demo` runs it.
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/sandbox-executor/sandbox-executor/internal/testing/testutil"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/chartinstall"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/localcluster"
	"github.com/sandbox-executor/sandbox-executor/tools/duoflow"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run() error {
	env, err := localcluster.Find()
	if err != nil {
		return err
	}
	root, err := testutil.ModuleRoot()
	if err != nil {
		return err
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", env.AdminKubeconfig())
	if err != nil {
		return err
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	inst, err := duoflow.NewInstance()
	if err != nil {
		return err
	}
	defer inst.Close()
	base, err := inst.CreateProject()
	if err != nil {
		return err
	}
	ctx := context.Background()
	suffix := fmt.Sprint(os.Getpid())
	fmt.Println("== helm install: the chart with the project's images, the runner in the cluster")
	r, err := chartinstall.Install(ctx, chartinstall.Options{Root: root, Env: env, Kube: kube,
		Namespace: "sbx-demo-" + suffix, GitLabNamespace: "sbx-demo-gitlab-" + suffix, Release: "duo",
		InstanceIP: inst.Host, RunnerToken: inst.GitLab.RunnerToken(), JobImage: localcluster.CIImage})
	if r != nil {
		defer func() {
			fmt.Println("== helm uninstall")
			if !r.Uninstalled() {
				if err := r.Uninstall(); err != nil {
					fmt.Fprintln(os.Stderr, "demo:", err)
				}
			}
			if err := r.Close(); err != nil {
				fmt.Fprintln(os.Stderr, "demo:", err)
			}
		}()
	}
	if err != nil {
		return err
	}
	fmt.Printf("== release %s in namespace %s (images %s); the runner registers with %s\n", r.Release, r.Namespace, r.Tag, r.GitLabURL)
	job := inst.Job(base, localcluster.CIImage)
	inst.GitLab.Enqueue(job)
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	res, err := inst.GitLab.Wait(ctx, job.ID)
	if err != nil {
		return fmt.Errorf("%w; runner pod log:\n%s", err, r.RunnerLog())
	}
	fmt.Println(res.Trace)
	fmt.Printf("\n== job %d: %s in %s (handed out -> final state), through gitlab-runner %s in pod %s/%s-runner and sandbox-executor\n",
		job.ID, res.State, res.Duration().Round(time.Millisecond), res.Runner.Version, r.Namespace, r.Fullname())
	if res.State != "success" {
		return fmt.Errorf("job %s (%s)", res.State, res.FailureReason)
	}
	pushed, err := inst.Repos.RepoGit(duoflow.Project, "log", "-1", "--stat", "--format=%h %an: %s", duoflow.Branch(job.ID))
	if err != nil {
		return err
	}
	fmt.Printf("== pushed to %s on the instance:\n%s\n", duoflow.Branch(job.ID), pushed)
	return r.Uninstall()
}
