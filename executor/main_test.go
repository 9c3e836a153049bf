package executor_test

import (
	"testing"

	"github.com/sandbox-executor/sandbox-executor/internal/testing/fakecluster"
)

func TestMain(m *testing.M) { fakecluster.Main(m) }
