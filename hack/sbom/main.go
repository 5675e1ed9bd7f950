// Command sbom writes the CycloneDX software bill of materials of one
// release image from the Go build information of the binaries it holds (one
// per platform): the Go modules linked into them, at the versions the
// linker recorded, and the Go standard library. hack/release.sh runs it for
// every image of `make release`.
//
//	go run ./hack/sbom --name mci-apiserver --version v1.2.3 \
//	  --output mci-apiserver-v1.2.3.cdx.json bin/linux_amd64/mci-apiserver bin/linux_arm64/mci-apiserver
//
// The build information is what the binary itself says (debug/buildinfo),
// not what go.mod asks for, so the bill lists what shipped. The document
// is deterministic: its time is --timestamp (the commit's, as the images')
// and its serial number is derived from its content.
package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"time"
)

func main() {
	name := flag.String("name", "", "Name of the image and of the binary it holds (mci-apiserver).")
	version := flag.String("version", "", "Release version (v1.2.3); every binary must carry it in its version stamp.")
	timestamp := flag.String("timestamp", "", "Creation time of the document in seconds since the epoch (default: now).")
	output := flag.String("output", "", "File to write the CycloneDX JSON document to (default: standard output).")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: sbom --name NAME --version VERSION [--timestamp SECONDS] [--output FILE] BINARY...\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if err := run(*name, *version, *timestamp, *output, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "sbom:", err)
		os.Exit(1)
	}
}

func run(name, version, timestamp, output string, binaries []string) error {
	if name == "" || version == "" {
		return fmt.Errorf("--name and --version are required")
	}
	if len(binaries) == 0 {
		return fmt.Errorf("no binary given")
	}
	created := time.Now()
	if timestamp != "" {
		seconds, err := strconv.ParseInt(timestamp, 10, 64)
		if err != nil {
			return fmt.Errorf("--timestamp %q: %w", timestamp, err)
		}
		created = time.Unix(seconds, 0)
	}
	var builds []Binary
	for _, path := range binaries {
		b, err := ReadBinary(path)
		if err != nil {
			return err
		}
		builds = append(builds, b)
	}
	bom, err := Build(name, version, created, builds)
	if err != nil {
		return err
	}
	out := os.Stdout
	if output != "" {
		f, err := os.Create(output)
		if err != nil {
			return err
		}
		defer f.Close()
		out = f
	}
	if err := Encode(out, bom); err != nil {
		return fmt.Errorf("writing the document: %w", err)
	}
	if output != "" {
		return out.Close()
	}
	return nil
}
