//go:build security

package security

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandbox-executor/sandbox-executor/tests/fakes/fakegitlab"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/clusterjobs"
)

func randomSecret(t *testing.T, prefix string) string {
	t.Helper()
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return prefix + hex.EncodeToString(b)
}

// TestJobSecretsStayOutOfClusterRecords: the job token, the Duo workflow token, GitLab tokens
// (as job variables and in the runner's own environment) and an ID token (a flow's id_tokens
// entry: a JWT, as a masked variable; its signature alone counts as a leak too) reach the job's
// scripts, yet appear in
// none of the pod, the SandboxClaim, the Sandbox, any object's annotations or any Event of the
// namespace, the pod's container log, nor in anything our binary printed in any stage.
func TestJobSecretsStayOutOfClusterRecords(t *testing.T) {
	t.Parallel()
	c := clusterjobs.Connect(t)
	r := c.NewRunner(t, "sec-secrets", "")
	secrets := map[string]string{
		"CI_JOB_TOKEN":               randomSecret(t, "glcbt-"),
		"DUO_WORKFLOW_SERVICE_TOKEN": randomSecret(t, "duo-"),
		"GITLAB_TOKEN":               randomSecret(t, "glpat-"),
	}
	idToken, err := fakegitlab.NewIDToken("https://gitlab.example.com", "https://vault.example.com", "project_path:group/project:ref_type:branch:ref:main", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	secrets["GITLAB_OIDC_TOKEN"] = idToken
	runnerToken := randomSecret(t, "glpat-runner-") // GITLAB_TOKEN of the runner host itself
	j := r.NewJob(t, clusterjobs.JobSpec{
		Token: secrets["CI_JOB_TOKEN"],
		Variables: map[string]string{"DUO_WORKFLOW_SERVICE_TOKEN": secrets["DUO_WORKFLOW_SERVICE_TOKEN"], "GITLAB_TOKEN": secrets["GITLAB_TOKEN"],
			"GITLAB_OIDC_TOKEN": idToken},
		RunnerEnv: []string{"GITLAB_TOKEN=" + runnerToken},
	})
	j.Prepare(t)

	// Like the runner's scripts, ours carry the variables in the script itself (which travels
	// over exec stdin). The job proves it got each one by its hash, never printing it.
	var script strings.Builder
	for k, v := range secrets {
		fmt.Fprintf(&script, "export %s='%s'\n", k, v)
	}
	for k := range secrets {
		fmt.Fprintf(&script, "printf '%s=%%s\\n' \"$(printf %%s \"$%s\" | sha256sum | cut -c1-64)\"\n", k, k)
	}
	out := j.MustRun(t, script.String()).Stdout
	for k, v := range secrets {
		sum := sha256.Sum256([]byte(v))
		if !strings.Contains(out, k+"="+hex.EncodeToString(sum[:])) {
			t.Errorf("positive control: the job did not get %s:\n%s", k, out)
		}
	}

	ctx := context.Background()
	records := map[string]any{}
	pod := j.PodObject(t)
	records["pod "+pod.Name] = pod
	records["claim "+j.ClaimName()] = j.Claim(t)
	sbx, err := c.Admin.Sandboxes.AgentsV1beta1().Sandboxes(clusterjobs.Namespace).Get(ctx, clusterjobs.SandboxOfClaim(t, c.Admin, j.Claim(t)), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	records["sandbox "+sbx.Name] = sbx
	// Every pod, sandbox and claim of the namespace, with their annotations.
	pods, err := c.Admin.Kube.CoreV1().Pods(clusterjobs.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	records["all pods"] = pods
	sandboxes, err := c.Admin.Sandboxes.AgentsV1beta1().Sandboxes(clusterjobs.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	records["all sandboxes"] = sandboxes
	claims, err := c.Admin.Extensions.ExtensionsV1beta1().SandboxClaims(clusterjobs.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	records["all claims"] = claims
	logs, err := c.Admin.Kube.CoreV1().Pods(clusterjobs.Namespace).GetLogs(pod.Name, &corev1.PodLogOptions{Container: "job"}).DoRaw(ctx)
	if err != nil {
		t.Fatal(err)
	}
	records["container log"] = string(logs)

	j.Cleanup(t)
	events, err := c.Admin.Kube.CoreV1().Events(clusterjobs.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	records["all events"] = events
	var stages []string
	for _, res := range j.Results {
		stages = append(stages, res.Stage)
		records["our output of "+res.Stage] = res.Stdout + res.Stderr
	}
	if len(stages) != 4 {
		t.Errorf("stages run: %q, want config, prepare, run and cleanup", stages)
	}

	all := []string{runnerToken, idToken[strings.LastIndex(idToken, ".")+1:]}
	for _, v := range secrets {
		all = append(all, v)
	}
	for what, record := range records {
		text, ok := record.(string)
		if !ok {
			data, err := json.Marshal(record)
			if err != nil {
				t.Fatal(err)
			}
			text = string(data)
		}
		for _, secret := range all {
			// The job's own output has the hashes, never the values: it counts as ours too.
			if strings.Contains(text, secret) {
				t.Errorf("a job secret (%s...) appears in %s", secret[:8], what)
			}
		}
	}
	t.Logf("checked %d records for %d secrets: %d events, %d pods, stages %s", len(records), len(all), len(events.Items), len(pods.Items), strings.Join(stages, ", "))
}

// TestNextJobSeesNothingOfThePrevious: a second job from the same pool gets a different pod and
// finds nothing the first left: no files in the builds directory, /tmp or $HOME, no variables
// exported through shell startup files, no processes the first left running in their own
// session. The first job's own later stage sees all of it: the markers do persist in a pod.
func TestNextJobSeesNothingOfThePrevious(t *testing.T) {
	t.Parallel()
	r := clusterjobs.Connect(t).NewRunner(t, "sec-contamination", "")
	mark := randomSecret(t, "mark")
	sleepArg := fmt.Sprintf("1000.%d", time.Now().UnixNano()%1e9) // a unique, valid duration
	look := fmt.Sprintf(`for f in /builds/%[1]s /tmp/%[1]s "$HOME/%[1]s"; do [ -e "$f" ] && echo "file $f"; done
echo "login-env=$(bash -lc 'echo $SEC_MARK')"
echo "interactive-env=$(bash -ic 'echo $SEC_MARK' 2>/dev/null)"
grep -l %[1]s /etc/environment 2>/dev/null | sed 's/^/in-file /'
for p in /proc/[0-9]*; do tr '\0' ' ' <"$p/cmdline" 2>/dev/null | grep -q "sleep %[2]s" && echo "process $p"; done
true
`, mark, sleepArg)

	first := prepared(t, r, clusterjobs.JobSpec{})
	first.MustRun(t, fmt.Sprintf(`mkdir -p /builds
for f in /builds/%[1]s /tmp/%[1]s "$HOME/%[1]s"; do echo secret >"$f"; done
export SEC_MARK=%[1]s
for f in "$HOME/.bashrc" "$HOME/.profile" /etc/profile; do echo "export SEC_MARK=%[1]s" >>"$f"; done
echo "SEC_MARK=%[1]s" >>/etc/environment
setsid -f sleep %[2]s </dev/null >/dev/null 2>&1
`, mark, sleepArg))
	seen := first.MustRun(t, look).Stdout
	for _, want := range []string{"file /builds/", "file /tmp/", "file /root/", "login-env=" + mark, "interactive-env=" + mark, "in-file", "process "} {
		if !strings.Contains(seen, want) {
			t.Errorf("positive control: the first job's next stage does not see %q:\n%s", want, seen)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	firstPod := first.PodUID
	first.Cleanup(t)

	second := prepared(t, r, clusterjobs.JobSpec{})
	if second.PodUID == firstPod {
		t.Fatalf("the second job got the first job's pod %s", second.Pod)
	}
	seen = second.MustRun(t, look).Stdout
	for _, leak := range []string{"file ", "in-file", "process ", mark} {
		if strings.Contains(seen, leak) {
			t.Errorf("the second job sees the first job's %q:\n%s", leak, seen)
		}
	}
	if !strings.Contains(seen, "login-env=\n") {
		t.Errorf("unexpected output in the second job:\n%s", seen)
	}
}
