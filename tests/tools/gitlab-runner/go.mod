// Wrapper module that pins the real GitLab Runner 12.8.0-pre so the tests can
// drive it. It is separate from the root module on purpose: requiring the
// runner drags in 2019-era docker, k8s.io and golang.org/x versions that must
// never leak into the executor's own module graph.
//
// 12.8.0-pre is the newest runner whose whole dependency graph the Go module
// proxy still serves; later ones need modules that are only on gitlab.com.
// Build it with ./build.sh.
module github.com/sandbox-executor/sandbox-executor/tests/tools/gitlab-runner

go 1.26.0

// The runner's own replace directives do not apply to a module that requires
// it, so they are repeated here: github.com/docker/docker at that pseudo-version
// only exists as github.com/docker/engine, and minio's go-homedir fork lives
// on gitlab.com under steveazz.
replace github.com/docker/docker v1.4.2-0.20190822180741-9552f2b2fdde => github.com/docker/engine v1.4.2-0.20190822180741-9552f2b2fdde

replace github.com/minio/go-homedir v0.0.0-20190425115525-017018655514 => gitlab.com/steveazz/go-homedir v0.0.0-20190425115525-017018655514

tool gitlab.com/gitlab-org/gitlab-runner

require (
	cloud.google.com/go v0.49.0 // indirect
	cloud.google.com/go/storage v1.0.0 // indirect
	github.com/Azure/go-ansiterm v0.0.0-20170929234023-d6e3b3328b78 // indirect
	github.com/Azure/go-autorest/autorest v0.9.2 // indirect
	github.com/Azure/go-autorest/autorest/adal v0.8.0 // indirect
	github.com/Azure/go-autorest/autorest/date v0.2.0 // indirect
	github.com/Azure/go-autorest/logger v0.1.0 // indirect
	github.com/Azure/go-autorest/tracing v0.5.0 // indirect
	github.com/BurntSushi/toml v0.3.1 // indirect
	github.com/Microsoft/go-winio v0.4.12 // indirect
	github.com/Nvveen/Gotty v0.0.0-20120604004816-cd527374f1e5 // indirect
	github.com/ayufan/golang-kardianos-service v0.0.0-20160429143213-0c8eb6d8fff2 // indirect
	github.com/beorn7/perks v1.0.1 // indirect
	github.com/containerd/continuity v0.0.0-20181203112020-004b46473808 // indirect
	github.com/davecgh/go-spew v1.1.1 // indirect
	github.com/dgrijalva/jwt-go v3.2.0+incompatible // indirect
	github.com/docker/cli v0.0.0-20181219132003-336b2a5cac7f // indirect
	github.com/docker/distribution v2.7.0+incompatible // indirect
	github.com/docker/docker v1.4.2-0.20190822180741-9552f2b2fdde // indirect
	github.com/docker/docker-credential-helpers v0.4.1 // indirect
	github.com/docker/go-connections v0.3.0 // indirect
	github.com/docker/go-metrics v0.0.0-20181218153428-b84716841b82 // indirect
	github.com/docker/go-units v0.3.2-0.20160802145505-eb879ae3e2b8 // indirect
	github.com/docker/machine v0.7.1-0.20170120224952-7b7a141da844 // indirect
	github.com/docker/spdystream v0.0.0-20160310174837-449fdfce4d96 // indirect
	github.com/fullsailor/pkcs7 v0.0.0-20190404230743-d7302db945fa // indirect
	github.com/getsentry/raven-go v0.0.0-20160518204710-dffeb57df75d // indirect
	github.com/go-ini/ini v1.28.2 // indirect
	github.com/gogo/protobuf v1.1.1 // indirect
	github.com/golang/protobuf v1.3.2 // indirect
	github.com/google/gofuzz v1.0.0 // indirect
	github.com/googleapis/gax-go/v2 v2.0.5 // indirect
	github.com/googleapis/gnostic v0.1.0 // indirect
	github.com/gophercloud/gophercloud v0.0.0-20180425001159-e25975f29734 // indirect
	github.com/gorhill/cronexpr v0.0.0-20160318121724-f0984319b442 // indirect
	github.com/gorilla/context v1.1.1 // indirect
	github.com/gorilla/mux v1.3.1-0.20170228224354-599cba5e7b61 // indirect
	github.com/gorilla/websocket v1.4.0 // indirect
	github.com/hashicorp/go-version v1.0.0 // indirect
	github.com/hashicorp/golang-lru v0.5.1 // indirect
	github.com/imdario/mergo v0.3.7 // indirect
	github.com/jpillora/backoff v0.0.0-20170222002228-06c7a16c845d // indirect
	// Raised from v1.1.7 together with reflect2: the older pair crashes at
	// run time on Go >= 1.18 (reflect2 relied on runtime map internals).
	github.com/json-iterator/go v1.1.12 // indirect
	github.com/jstemmer/go-junit-report v0.0.0-20190106144839-af01ea7f8024 // indirect
	github.com/kardianos/osext v0.0.0-20160811001526-c2c54e542fb7 // indirect
	github.com/konsorten/go-windows-terminal-sequences v1.0.1 // indirect
	github.com/kr/pty v1.1.1 // indirect
	github.com/markelog/trie v0.0.0-20171230083431-098fa99650c0 // indirect
	github.com/mattn/go-zglob v0.0.1 // indirect
	github.com/matttproud/golang_protobuf_extensions v1.0.1 // indirect
	github.com/minio/go-homedir v0.0.0-20190425115525-017018655514 // indirect
	github.com/minio/minio-go v3.0.3-0.20170912212908-4e0f567303d4+incompatible // indirect
	github.com/mitchellh/gox v1.0.1 // indirect
	github.com/mitchellh/iochan v1.0.0 // indirect
	github.com/modern-go/concurrent v0.0.0-20180306012644-bacd9c7ef1dd // indirect
	// Raised from v1.0.1, see json-iterator above.
	github.com/modern-go/reflect2 v1.0.2 // indirect
	github.com/opencontainers/go-digest v1.0.0-rc1 // indirect
	github.com/opencontainers/image-spec v1.0.1 // indirect
	github.com/opencontainers/runc v1.0.0-rc6.0.20190115182101-c1e454b2a1bf // indirect
	github.com/pkg/errors v0.8.0 // indirect
	github.com/pmezard/go-difflib v1.0.0 // indirect
	github.com/prometheus/client_golang v1.1.0 // indirect
	github.com/prometheus/client_model v0.0.0-20190129233127-fd36f4220a90 // indirect
	github.com/prometheus/common v0.6.0 // indirect
	github.com/prometheus/procfs v0.0.5 // indirect
	github.com/sirupsen/logrus v1.4.2 // indirect
	github.com/spf13/pflag v1.0.1-0.20171106142849-4c012f6dcd95 // indirect
	github.com/stretchr/objx v0.1.1 // indirect
	github.com/stretchr/testify v1.3.0 // indirect
	github.com/tevino/abool v0.0.0-20160628101133-3c25f2fe7cd0 // indirect
	github.com/urfave/cli v1.20.0 // indirect
	github.com/vektra/mockery v0.0.0-20181123154057-e78b021dcbb5 // indirect
	gitlab.com/ayufan/golang-cli-helpers v0.0.0-20171103152739-a7cf72d604cd // indirect
	gitlab.com/gitlab-org/gitlab-runner v1.11.1-0.20200110014830-8e5683f82927 // indirect
	gitlab.com/gitlab-org/gitlab-terminal v0.0.0-20180924111848-5af59b871b1b // indirect
	go.opencensus.io v0.22.0 // indirect
	golang.org/x/crypto v0.0.0-20190605123033-f99c8df09eb5 // indirect
	golang.org/x/exp v0.0.0-20191030013958-a1ab85dbe136 // indirect
	golang.org/x/lint v0.0.0-20191125180803-fdd1cda4f05f // indirect
	golang.org/x/net v0.0.0-20190620200207-3b0461eec859 // indirect
	golang.org/x/oauth2 v0.0.0-20190604053449-0f29369cfe45 // indirect
	golang.org/x/sys v0.0.0-20190801041406-cbf593c0f2f3 // indirect
	golang.org/x/text v0.3.2 // indirect
	golang.org/x/time v0.0.0-20190308202827-9d24e82272b4 // indirect
	golang.org/x/tools v0.0.0-20191126055441-b0650ceb63d9 // indirect
	google.golang.org/api v0.14.0 // indirect
	google.golang.org/appengine v1.6.1 // indirect
	google.golang.org/genproto v0.0.0-20191115194625-c23dd37a84c9 // indirect
	google.golang.org/grpc v1.21.1 // indirect
	gopkg.in/inf.v0 v0.9.0 // indirect
	gopkg.in/yaml.v2 v2.2.4 // indirect
	honnef.co/go/tools v0.0.1-2019.2.3 // indirect
	k8s.io/api v0.0.0-20191004102349-159aefb8556b // indirect
	k8s.io/apimachinery v0.0.0-20191004074956-c5d2f014d689 // indirect
	k8s.io/client-go v11.0.1-0.20191004102930-01520b8320fc+incompatible // indirect
	k8s.io/klog v1.0.0 // indirect
	k8s.io/utils v0.0.0-20190923111123-69764acb6e8e // indirect
	sigs.k8s.io/yaml v1.1.0 // indirect
)
