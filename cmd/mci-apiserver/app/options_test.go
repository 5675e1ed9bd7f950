package app

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestDefaultsCarryHundredsOfWatchesAndDrainThem(t *testing.T) {
	o := NewOptions()
	assert.Equal(t, 1000, o.Recommended.SecureServing.HTTP2MaxStreamsPerConnection, "the aggregator multiplexes watches over one HTTP/2 connection")
	assert.Equal(t, 10*time.Second, o.ServerRun.ShutdownWatchTerminationGracePeriod)
	assert.Equal(t, 5*time.Minute, o.RemoveAfter)
}

func TestValidateMemberThresholds(t *testing.T) {
	tests := []struct {
		name              string
		unreachable, gone time.Duration
		wantErr           string
	}{
		{name: "the defaults are valid", unreachable: 10 * time.Second, gone: 5 * time.Minute},
		{name: "removal must come after flagging", unreachable: time.Minute, gone: time.Minute, wantErr: "--member-remove-after (1m0s) must exceed --member-unreachable-after (1m0s)"},
		{name: "flagging needs a positive threshold", unreachable: 0, gone: time.Minute, wantErr: "--member-unreachable-after must be positive"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := NewOptions()
			o.ClusterName = "cluster-a"
			o.UnreachableAfter, o.RemoveAfter = tc.unreachable, tc.gone
			err := o.Validate()
			if tc.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.wantErr)
		})
	}
}

func TestValidateServingCertSources(t *testing.T) {
	tests := []struct {
		name             string
		secret, certFile string
		wantErr          string
	}{
		{name: "a Secret alone is valid", secret: "mci-apiserver-tls"},
		{name: "a certificate file alone is valid", certFile: "/etc/tls/tls.crt"},
		{name: "both are refused", secret: "mci-apiserver-tls", certFile: "/etc/tls/tls.crt", wantErr: "--serving-cert-secret and --tls-cert-file are exclusive"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := NewOptions()
			o.ClusterName = "cluster-a"
			o.ServingCertSecret = tc.secret
			o.Recommended.SecureServing.ServerCert.CertKey.CertFile = tc.certFile
			o.Recommended.SecureServing.ServerCert.CertKey.KeyFile = tc.certFile + ".key"
			if tc.certFile == "" {
				o.Recommended.SecureServing.ServerCert.CertKey.KeyFile = ""
			}
			err := o.Validate()
			if tc.wantErr == "" {
				require.NoError(t, err)
				return
			}
			assert.ErrorContains(t, err, tc.wantErr)
		})
	}
}

func TestExportedStatusIsOnByDefaultAndCanBeTurnedOff(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want bool
	}{
		{name: "on by default", want: true},
		{name: "off with --exported-status=false", args: []string{"--exported-status=false"}, want: false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := NewOptions()
			require.NoError(t, NewCommand(o).Flags().Parse(tc.args))
			assert.Equal(t, tc.want, o.ExportedStatus)
		})
	}
}

func TestValidateClusterProfileFlags(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		wantErr string
	}{
		{name: "off by default"},
		{name: "a namespace and a provider file are valid", args: []string{"--clusterprofile-namespace=fleet", "--clusterprofile-provider-file=/etc/mci/providers.json"}},
		{name: "a hub kubeconfig may be given", args: []string{"--clusterprofile-namespace=fleet", "--clusterprofile-provider-file=/p.json", "--clusterprofile-kubeconfig=/hub.kubeconfig"}},
		{name: "a namespace needs a provider file", args: []string{"--clusterprofile-namespace=fleet"}, wantErr: "--clusterprofile-provider-file is required with --clusterprofile-namespace"},
		{name: "the ClusterSet name must be a label value", args: []string{"--clusterprofile-namespace=fleet", "--clusterprofile-provider-file=/p.json", "--clusterset-name=not/a/label"}, wantErr: "cannot select ClusterProfiles"},
		{name: "a provider file alone is refused", args: []string{"--clusterprofile-provider-file=/p.json"}, wantErr: "need --clusterprofile-namespace"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := NewOptions()
			require.NoError(t, NewCommand(o).Flags().Parse(append([]string{"--cluster-name=cluster-a"}, tc.args...)))
			err := o.Validate()
			if tc.wantErr == "" {
				require.NoError(t, err)
				return
			}
			assert.ErrorContains(t, err, tc.wantErr)
		})
	}
}
