package app

import (
	"errors"
	"fmt"

	"github.com/spf13/pflag"

	"github.com/mci-dev/mci/pkg/outlier"
	"github.com/mci-dev/mci/pkg/sidecar"
)

// OutlierOptions are the flags of outlier detection: which failures take a
// cluster out of the choice of new requests, and for how long.
type OutlierOptions struct {
	Enabled   bool
	Detection outlier.Config
	FirstByte outlier.FirstByteConfig
}

// NewOutlierOptions returns the defaults: on, outlier.DefaultConfig and
// outlier.DefaultFirstByteConfig.
func NewOutlierOptions() OutlierOptions {
	return OutlierOptions{Enabled: true, Detection: outlier.DefaultConfig(), FirstByte: outlier.DefaultFirstByteConfig()}
}

// AddFlags adds the --outlier-* flags.
func (o *OutlierOptions) AddFlags(fs *pflag.FlagSet) {
	d, fb := &o.Detection, &o.FirstByte
	fs.BoolVar(&o.Enabled, "outlier-detection", o.Enabled, "Take a cluster whose responses fail out of the choice of new requests for a while (outlier detection, as Envoy's for hosts), under every cluster policy: a cluster answering 5xx at once looks idle and fast to every load measure. Each change is logged once and shown by mci_sidecar_outlier_ejected.")
	fs.IntVar(&d.Consecutive5xx, "outlier-consecutive-5xx", d.Consecutive5xx, "Eject a cluster after this many failures in a row of the requests it took (5xx responses and gateway failures). 0: never for this reason.")
	fs.IntVar(&d.ConsecutiveGatewayFailure, "outlier-consecutive-gateway-failures", d.ConsecutiveGatewayFailure, "Eject a cluster after this many gateway failures in a row: responses 502, 503, 504 (a gateway's answers when it cannot connect, is reset or times out), no first byte within --outlier-first-byte-*. 0: never for this reason. (An EPP that fails is not an outlier: passive health takes it out until its next good health check.)")
	fs.DurationVar(&d.SuccessRateInterval, "outlier-success-rate-interval", d.SuccessRateInterval, "Window of the success-rate rule: at its end, a cluster whose success rate is below --outlier-success-rate-factor times that of its pool's other clusters together is ejected. 0: no success-rate rule.")
	fs.IntVar(&d.SuccessRateMinimumRequests, "outlier-success-rate-minimum-requests", d.SuccessRateMinimumRequests, "Requests a cluster, and its pool's other clusters together, need in a window to be judged by the success-rate rule.")
	fs.Float64Var(&d.SuccessRateFactor, "outlier-success-rate-factor", d.SuccessRateFactor, "Share (0 to 1) of the other clusters' success rate below which a cluster is ejected; clusters that all fail alike eject none.")
	fs.DurationVar(&d.BaseEjectionTime, "outlier-base-ejection-time", d.BaseEjectionTime, "Length of a first ejection; each ejection in a row adds as much (a cluster back for this long forgets one). Then the cluster takes one request at a time until one succeeds, or is ejected again at once.")
	fs.DurationVar(&d.MaxEjectionTime, "outlier-max-ejection-time", d.MaxEjectionTime, "Longest ejection: a cluster that recovers takes requests again within about this long.")
	fs.IntVar(&d.MaxEjectionPercent, "outlier-max-ejection-percent", d.MaxEjectionPercent, "Most clusters of a pool ejected at once, in percent; one of two or more may always be, and never all. A withheld ejection is logged and counted in mci_sidecar_outlier_ejections_withheld_total.")
	fs.Float64Var(&fb.Quantile, "outlier-first-byte-quantile", fb.Quantile, "The first-byte bound of a cluster is --outlier-first-byte-factor times this quantile (0 to 1) of its last 128 times to first byte, within the floor and the ceiling; a request that waits longer for its first byte is a gateway failure of the cluster.")
	fs.Float64Var(&fb.Factor, "outlier-first-byte-factor", fb.Factor, "See --outlier-first-byte-quantile; at least 1.")
	fs.DurationVar(&fb.Floor, "outlier-first-byte-floor", fb.Floor, "Shortest first-byte bound of a cluster.")
	fs.DurationVar(&fb.Ceiling, "outlier-first-byte-ceiling", fb.Ceiling, "Longest first-byte bound of a cluster, and the bound of a cluster with fewer than 10 times to first byte measured. 0: no first-byte bound (for a gateway that does not send the response headers to its ext_proc server).")
}

// Validate checks the flags.
func (o *OutlierOptions) Validate() error {
	if !o.Enabled {
		return nil
	}
	var errs []error
	if err := o.Detection.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("--outlier-*: %w", err))
	}
	if o.FirstByte.Ceiling != 0 {
		if err := o.FirstByte.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("--outlier-first-byte-*: %w", err))
		}
	}
	return errors.Join(errs...)
}

// Config is the sidecar's configuration of outlier detection; nil when
// off.
func (o *OutlierOptions) Config() *sidecar.OutlierConfig {
	if !o.Enabled {
		return nil
	}
	return &sidecar.OutlierConfig{Detection: o.Detection, FirstByte: o.FirstByte}
}
