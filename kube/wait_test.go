package kube_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	k8stesting "k8s.io/client-go/testing"

	"github.com/sandbox-executor/sandbox-executor/failure"
	"github.com/sandbox-executor/sandbox-executor/internal/testing/fakecluster"
	"github.com/sandbox-executor/sandbox-executor/kube"
)

// A watch the API server can no longer resume (410 Gone) costs a re-read, not the job.
func TestClaimRereadsAfterItsWatchIsGone(t *testing.T) {
	fc := fakecluster.NewCluster(t)
	var watches, gets atomic.Int32
	fc.Extensions.PrependWatchReactor("sandboxclaims", func(k8stesting.Action) (bool, watch.Interface, error) {
		if watches.Add(1) > 1 {
			return false, nil, nil // the fake controller's watch
		}
		gone := watch.NewRaceFreeFake()
		gone.Error(&apierrors.NewResourceExpired("too old resource version").ErrStatus)
		return true, gone, nil
	})
	fc.Extensions.PrependReactor("get", "sandboxclaims", func(k8stesting.Action) (bool, runtime.Object, error) {
		gets.Add(1)
		return false, nil, nil
	})
	if _, err := fc.Claimer().Claim(context.Background(), testRequest()); err != nil {
		t.Fatalf("Claim: %v", err)
	}
	if watches.Load() != 2 || gets.Load() != 1 {
		t.Errorf("%d watches and %d gets, want 2 watches with one re-read between", watches.Load(), gets.Load())
	}
}

func TestWaitPoolReady(t *testing.T) {
	denied := apierrors.NewForbidden(kube.SandboxWarmPools, fakecluster.Pool, nil)
	for _, tc := range []struct {
		name  string
		watch func(fc *fakecluster.Cluster) k8stesting.WatchReactionFunc
		want  string // "" for success
		kind  failure.Kind
	}{
		{"a sandbox becomes ready", func(fc *fakecluster.Cluster) k8stesting.WatchReactionFunc {
			return func(action k8stesting.Action) (bool, watch.Interface, error) {
				go fc.SetPoolReady(t, 1)
				return false, nil, nil
			}
		}, "", 0},
		{"watch denied", func(*fakecluster.Cluster) k8stesting.WatchReactionFunc {
			return func(k8stesting.Action) (bool, watch.Interface, error) { return true, nil, denied }
		}, "RBAC denied: cannot watch sandboxwarmpools.extensions.agents.x-k8s.io in namespace sandbox-executor", failure.KindPermanent},
		{"none in time", func(*fakecluster.Cluster) k8stesting.WatchReactionFunc {
			return func(k8stesting.Action) (bool, watch.Interface, error) { return false, nil, nil }
		}, `warm pool sandbox-executor/duo-default had no ready sandbox for 300ms (drained_pool = "wait")`, failure.KindSystem},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fc := fakecluster.NewCluster(t)
			fc.SetPoolReady(t, 0)
			fc.Extensions.PrependWatchReactor("sandboxwarmpools", tc.watch(fc))
			err := fc.Claimer().WaitPoolReady(context.Background(), fakecluster.Namespace, fakecluster.Pool, 300*time.Millisecond)
			if tc.want == "" {
				if err != nil {
					t.Errorf("WaitPoolReady: %v", err)
				}
				return
			}
			if failure.KindOf(err) != tc.kind || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v (kind %d), want kind %d containing %q", err, failure.KindOf(err), tc.kind, tc.want)
			}
		})
	}
}
