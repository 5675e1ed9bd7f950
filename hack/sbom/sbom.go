package main

import (
	"crypto/sha256"
	"debug/buildinfo"
	"fmt"
	"io"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	cdx "github.com/CycloneDX/cyclonedx-go"
	"github.com/google/uuid"
	packageurl "github.com/package-url/packageurl-go"
)

// versionVar is the variable `make release` stamps the version into
// (pkg/version, through -ldflags -X).
const versionVar = "github.com/mci-dev/mci/pkg/version.gitVersion"

// Binary is one built binary and what the Go linker recorded about it.
type Binary struct {
	Path string
	Info *debug.BuildInfo
}

// ReadBinary reads the build information of the binary at path.
func ReadBinary(path string) (Binary, error) {
	info, err := buildinfo.ReadFile(path)
	if err != nil {
		return Binary{}, fmt.Errorf("reading the build information of %s: %w", path, err)
	}
	return Binary{Path: path, Info: info}, nil
}

// setting returns the build setting key of info ("" when absent).
func setting(info *debug.BuildInfo, key string) string {
	for _, s := range info.Settings {
		if s.Key == key {
			return s.Value
		}
	}
	return ""
}

// stampedVersion returns the version the binary was linked with (the -X
// of versionVar in its recorded -ldflags), and whether there is one: Go
// records no -ldflags for a -trimpath build.
func stampedVersion(info *debug.BuildInfo) (string, bool) {
	for _, field := range strings.Fields(setting(info, "-ldflags")) {
		if v, ok := strings.CutPrefix(field, versionVar+"="); ok {
			return v, true
		}
	}
	return "", false
}

// Build returns the bill of materials of the image name at version, whose
// platforms' binaries are builds: one application (the main package, at
// the release version) that depends on every module linked into any of
// them and on the Go standard library. The binaries of one image are
// builds of one package of one module and commit, by one Go release, and,
// where the build recorded its version stamp, at the release version:
// anything else is an error, not a merged bill.
func Build(name, version string, created time.Time, builds []Binary) (*cdx.BOM, error) {
	if len(builds) == 0 {
		return nil, fmt.Errorf("no binary given")
	}
	first := builds[0].Info
	var platforms []string
	libraries := map[string]cdx.Component{}
	for _, b := range builds {
		info := b.Info
		if info.Path != first.Path || info.Main.Path != first.Main.Path || info.GoVersion != first.GoVersion {
			return nil, fmt.Errorf("%s is package %s of module %s built by %s, %s is package %s of module %s built by %s: not builds of one image",
				b.Path, info.Path, info.Main.Path, info.GoVersion, builds[0].Path, first.Path, first.Main.Path, first.GoVersion)
		}
		// A -trimpath build does not record its -ldflags: the version stamp
		// is checked where it is recorded, the commit always.
		if stamped, ok := stampedVersion(info); ok && stamped != version {
			return nil, fmt.Errorf("%s is stamped %s, not the release version %s", b.Path, stamped, version)
		}
		for _, key := range []string{"vcs.revision", "vcs.modified"} {
			if setting(info, key) != setting(first, key) {
				return nil, fmt.Errorf("%s has %s %q, %s has %q: not builds of one commit", b.Path, key, setting(info, key), builds[0].Path, setting(first, key))
			}
		}
		platforms = append(platforms, setting(info, "GOOS")+"/"+setting(info, "GOARCH"))
		for _, dep := range info.Deps {
			c, err := library(dep)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", b.Path, err)
			}
			libraries[c.BOMRef] = c
		}
	}
	std := cdx.Component{
		Type:    cdx.ComponentTypeLibrary,
		Name:    "std",
		Version: first.GoVersion,
		// The Go standard library, as vulnerability databases name it.
		PackageURL: packageurl.NewPackageURL(packageurl.TypeGolang, "", "std", first.GoVersion, nil, "").ToString(),
	}
	std.BOMRef = std.PackageURL
	libraries[std.BOMRef] = std

	mainPURL := purl(first.Main.Path, version, strings.TrimPrefix(strings.TrimPrefix(first.Path, first.Main.Path), "/"))
	app := cdx.Component{
		BOMRef:     mainPURL,
		Type:       cdx.ComponentTypeApplication,
		Name:       name,
		Version:    version,
		PackageURL: mainPURL,
		Properties: &[]cdx.Property{{Name: "mci:package", Value: first.Path}},
	}
	slices.Sort(platforms)
	for _, p := range platforms {
		*app.Properties = append(*app.Properties, cdx.Property{Name: "mci:platform", Value: p})
	}

	refs := make([]string, 0, len(libraries))
	for ref := range libraries {
		refs = append(refs, ref)
	}
	slices.Sort(refs)
	components := make([]cdx.Component, 0, len(refs))
	for _, ref := range refs {
		components = append(components, libraries[ref])
	}

	bom := cdx.NewBOM()
	bom.Metadata = &cdx.Metadata{
		Timestamp: created.UTC().Format(time.RFC3339),
		Tools:     &cdx.ToolsChoice{Components: tools()},
		Component: &app,
	}
	bom.Components = &components
	// The build information records no graph between modules: the
	// application depends on each of them.
	bom.Dependencies = &[]cdx.Dependency{{Ref: app.BOMRef, Dependencies: &refs}}
	bom.SerialNumber = serialNumber(app, refs)
	return bom, nil
}

// library is the component of one linked module: the replacement when the
// module was replaced, since that is what the binary holds.
func library(dep *debug.Module) (cdx.Component, error) {
	m := dep
	if dep.Replace != nil {
		m = dep.Replace
	}
	if m.Path == "" || m.Version == "" {
		return cdx.Component{}, fmt.Errorf("module %q has no version (a replacement by a directory cannot be listed)", dep.Path)
	}
	c := cdx.Component{
		Type:       cdx.ComponentTypeLibrary,
		Name:       m.Path,
		Version:    m.Version,
		PackageURL: purl(m.Path, m.Version, ""),
	}
	c.BOMRef = c.PackageURL
	if dep.Replace != nil {
		c.Properties = &[]cdx.Property{{Name: "mci:replaces", Value: dep.Path + "@" + dep.Version}}
	}
	return c, nil
}

// purl is the package URL of a Go module (and package subpath): its path's
// last element is the name, the rest the namespace.
func purl(modulePath, version, subpath string) string {
	namespace, name := "", modulePath
	if i := strings.LastIndex(modulePath, "/"); i >= 0 {
		namespace, name = modulePath[:i], modulePath[i+1:]
	}
	return packageurl.NewPackageURL(packageurl.TypeGolang, namespace, name, version, nil, subpath).ToString()
}

// tools names this program and the library that writes the document, at
// the versions this build of it links.
func tools() *[]cdx.Component {
	tool := cdx.Component{Type: cdx.ComponentTypeApplication, Name: "mci hack/sbom"}
	components := []cdx.Component{tool}
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, dep := range info.Deps {
			if dep.Path == "github.com/CycloneDX/cyclonedx-go" {
				components = append(components, cdx.Component{Type: cdx.ComponentTypeLibrary, Name: dep.Path, Version: dep.Version})
			}
		}
	}
	return &components
}

// serialNumber derives the document's URN from what it lists, so that the
// same binaries give the same document.
func serialNumber(app cdx.Component, refs []string) string {
	h := sha256.New()
	fmt.Fprintln(h, app.BOMRef)
	if app.Properties != nil {
		for _, p := range *app.Properties {
			fmt.Fprintln(h, p.Name, p.Value)
		}
	}
	for _, ref := range refs {
		fmt.Fprintln(h, ref)
	}
	return uuid.NewSHA1(uuid.NameSpaceURL, h.Sum(nil)).URN()
}

// Encode writes bom as CycloneDX 1.6 JSON.
func Encode(w io.Writer, bom *cdx.BOM) error {
	return cdx.NewBOMEncoder(w, cdx.BOMFileFormatJSON).SetPretty(true).EncodeVersion(bom, cdx.SpecVersion1_6)
}
