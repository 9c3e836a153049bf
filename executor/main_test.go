package executor_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/sandbox-executor/sandbox-executor/executor/executortest"
)

func TestMain(m *testing.M) {
	executortest.Main(leakChecked{m})
}

// leakChecked fails the run when a test leaves goroutines behind.
type leakChecked struct{ m *testing.M }

func (l leakChecked) Run() int {
	code := l.m.Run()
	if code == 0 {
		if err := goleak.Find(goleak.IgnoreTopFunction("k8s.io/klog/v2.(*flushDaemon).run.func1")); err != nil {
			println("goleak:", err.Error())
			return 1
		}
	}
	return code
}
