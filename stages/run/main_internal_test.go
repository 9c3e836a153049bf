package run

import (
	"testing"

	"github.com/sandbox-executor/sandbox-executor/internal/testing/fakecluster"
)

func TestMain(m *testing.M) { fakecluster.VerifyNoLeaks(m) }
