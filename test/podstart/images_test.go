package podstart

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/mci-dev/mci/test/ociimage"
)

// errImageNotBuiltHere is the error of an image that `make images` does
// not build and that cannot be pulled here (Envoy's).
var errImageNotBuiltHere = errors.New("image not built here")

// unavailableImages are the repositories of images the chart renders that
// no registry can give this machine: their containers are named and not
// started. Any other image must be one of `make images`.
var unavailableImages = []string{"envoyproxy/envoy"}

// imageStore pulls images, as a kubelet would from a registry, from the
// archives of `make images`: the reference <repository>:<tag> is found
// in <dir>/<repository>-<tag>.tar under that name.
type imageStore struct {
	dir     string
	scratch string

	mu     sync.Mutex
	images map[string]*ociimage.Image
}

func (s *imageStore) image(ref string) (*ociimage.Image, error) {
	repo, tag, ok := strings.Cut(ref, ":")
	if !ok || strings.Contains(tag, "/") {
		return nil, fmt.Errorf("image %q has no tag: the chart pins every image", ref)
	}
	for _, u := range unavailableImages {
		if repo == u || strings.HasSuffix(repo, "/"+u) {
			return nil, fmt.Errorf("%s: %w", ref, errImageNotBuiltHere)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if img, ok := s.images[ref]; ok {
		return img, nil
	}
	archive := filepath.Join(s.dir, repo+"-"+tag+".tar")
	if strings.Contains(repo, "/") {
		return nil, fmt.Errorf("image %q: the test pulls only mci's images, named without a registry", ref)
	}
	dir, err := os.MkdirTemp(s.scratch, repo+"-")
	if err != nil {
		return nil, err
	}
	img, err := ociimage.Open(archive, ref, dir)
	if err != nil {
		return nil, fmt.Errorf("pulling %s: %w", ref, err)
	}
	if s.images == nil {
		s.images = map[string]*ociimage.Image{}
	}
	s.images[ref] = img
	return img, nil
}
