package extproc

import (
	"fmt"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// SubsetHint reads the endpoints the gateway allows for this request from
// the filter metadata SubsetHintNamespace / SubsetHintKey. present is false
// when the hint is absent: every endpoint of the pool may be picked. A
// present hint with no endpoints allows none (the protocol answers 503).
//
// The protocol's value is a list of "ip:port" strings; a single string of
// comma-separated endpoints is accepted too. Any other value is an error.
func SubsetHint(md *corev3.Metadata) (endpoints []string, present bool, err error) {
	ns := md.GetFilterMetadata()[SubsetHintNamespace]
	if ns == nil {
		return nil, false, nil
	}
	v, ok := ns.GetFields()[SubsetHintKey]
	if !ok {
		return nil, false, nil
	}
	switch k := v.GetKind().(type) {
	case *structpb.Value_ListValue:
		endpoints = make([]string, 0, len(k.ListValue.GetValues()))
		for _, e := range k.ListValue.GetValues() {
			s, ok := e.GetKind().(*structpb.Value_StringValue)
			if !ok {
				return nil, true, fmt.Errorf("%s/%s: an entry is %T, want a string", SubsetHintNamespace, SubsetHintKey, e.GetKind())
			}
			if ep := strings.TrimSpace(s.StringValue); ep != "" {
				endpoints = append(endpoints, ep)
			}
		}
		return endpoints, true, nil
	case *structpb.Value_StringValue:
		return SplitEndpoints(k.StringValue), true, nil
	default:
		return nil, true, fmt.Errorf("%s/%s is %T, want a list of endpoints", SubsetHintNamespace, SubsetHintKey, v.GetKind())
	}
}

// SubsetHintMetadata returns filter metadata carrying a subset hint of the
// given endpoints; with none it carries an empty list, which allows none.
func SubsetHintMetadata(endpoints ...string) *corev3.Metadata {
	values := make([]*structpb.Value, len(endpoints))
	for i, e := range endpoints {
		values[i] = structpb.NewStringValue(e)
	}
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
		SubsetHintNamespace: {Fields: map[string]*structpb.Value{
			SubsetHintKey: structpb.NewListValue(&structpb.ListValue{Values: values}),
		}},
	}}
}

// DestinationFromMetadata returns the destination value in dynamic metadata
// (DestinationEndpointNamespace / DestinationEndpointKey), "" when absent.
func DestinationFromMetadata(md *structpb.Struct) string {
	ns := md.GetFields()[DestinationEndpointNamespace].GetStructValue()
	return ns.GetFields()[DestinationEndpointKey].GetStringValue()
}

// SplitEndpoints splits a destination or subset value "ip:port,ip:port" into
// its endpoints, dropping blanks.
func SplitEndpoints(value string) []string {
	var endpoints []string
	for e := range strings.SplitSeq(value, ",") {
		if e = strings.TrimSpace(e); e != "" {
			endpoints = append(endpoints, e)
		}
	}
	return endpoints
}

// ServedEndpoint returns the endpoint that served the request, as the
// gateway reports it in the metadata_context of the response phase: the
// filter metadata DestinationEndpointNamespace / DestinationEndpointServedKey
// of the Endpoint Picker protocol. "" when the gateway does not report it.
func ServedEndpoint(md *corev3.Metadata) string {
	return md.GetFilterMetadata()[DestinationEndpointNamespace].GetFields()[DestinationEndpointServedKey].GetStringValue()
}

// ServedMetadata returns the metadata_context a gateway sends in the
// response phase to report the endpoint that served the request.
func ServedMetadata(endpoint string) *corev3.Metadata {
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
		DestinationEndpointNamespace: {Fields: map[string]*structpb.Value{
			DestinationEndpointServedKey: structpb.NewStringValue(endpoint),
		}},
	}}
}
