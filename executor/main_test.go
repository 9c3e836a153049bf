package executor_test

import (
	"testing"

	"github.com/sandbox-executor/sandbox-executor/tests/executortest"
)

func TestMain(m *testing.M) { executortest.Main(m) }
