package kube

import (
	"math"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// RetryBackoff is the schedule for trying a pod again after a lost connection (an exec or attach
// stream that dropped): from 200 ms, doubling, to 5 s.
func RetryBackoff() wait.Backoff {
	return wait.Backoff{Duration: 200 * time.Millisecond, Factor: 2, Steps: math.MaxInt32, Cap: 5 * time.Second}
}
