package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// repoRoot is the repository root, two levels above this package.
const repoRoot = "../.."

// markdownFiles are the pages a reader follows links between: the README
// and everything under docs/.
func markdownFiles(t *testing.T) []string {
	t.Helper()
	files := []string{"README.md"}
	err := filepath.WalkDir(filepath.Join(repoRoot, "docs"), func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(path, ".md") {
			rel, err := filepath.Rel(repoRoot, path)
			if err != nil {
				return err
			}
			files = append(files, filepath.ToSlash(rel))
		}
		return nil
	})
	require.NoError(t, err)
	return files
}

var (
	inlineLink    = regexp.MustCompile(`!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)`)
	referenceLink = regexp.MustCompile(`^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+"[^"]*")?\s*$`)
	codeSpan      = regexp.MustCompile("`[^`]*`")
	htmlAnchor    = regexp.MustCompile(`<a\s+(?:name|id)="([^"]+)"`)
	schemeLink    = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)
)

// prose returns the lines of a markdown file outside fenced code blocks,
// where links and headings are what they look like.
func prose(content string) []string {
	var out []string
	fence := ""
	for _, line := range strings.Split(content, "\n") {
		trimmed := strings.TrimSpace(line)
		switch {
		case fence != "":
			if strings.HasPrefix(trimmed, fence) {
				fence = ""
			}
			out = append(out, "")
			continue
		case strings.HasPrefix(trimmed, "```"):
			fence = "```"
		case strings.HasPrefix(trimmed, "~~~"):
			fence = "~~~"
		}
		if fence != "" {
			out = append(out, "")
			continue
		}
		out = append(out, line)
	}
	return out
}

// links returns the targets of a file's links.
func links(content string) []string {
	var targets []string
	for _, line := range prose(content) {
		line = codeSpan.ReplaceAllString(line, "")
		for _, m := range inlineLink.FindAllStringSubmatch(line, -1) {
			targets = append(targets, m[1])
		}
		if m := referenceLink.FindStringSubmatch(line); m != nil {
			targets = append(targets, m[1])
		}
	}
	return targets
}

// anchors returns the fragment identifiers a markdown file offers: its
// headings' slugs, by GitHub's rules (numbered -1, -2, ... when repeated),
// and its HTML anchors.
func anchors(content string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, line := range prose(content) {
		for _, m := range htmlAnchor.FindAllStringSubmatch(line, -1) {
			out[m[1]] = true
		}
		if !strings.HasPrefix(line, "#") {
			continue
		}
		text := strings.TrimLeft(line, "#")
		if text == "" || text[0] != ' ' {
			continue
		}
		slug := headingSlug(text)
		if n := seen[slug]; n > 0 {
			out[slug+"-"+strconv.Itoa(n)] = true
		} else {
			out[slug] = true
		}
		seen[slug]++
	}
	return out
}

var markdownLinkText = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)

// headingSlug is GitHub's anchor of a heading: the text as rendered, lower
// case, with everything but letters, digits, spaces, '-' and '_' dropped
// and each space made a '-'.
func headingSlug(heading string) string {
	text := strings.TrimSpace(strings.TrimRight(strings.TrimSpace(heading), "#"))
	text = markdownLinkText.ReplaceAllString(text, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(text) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

func TestHeadingSlugsFollowGitHubRules(t *testing.T) {
	for _, tc := range []struct{ heading, slug string }{
		{"Cluster policies", "cluster-policies"},
		{"TLS to Endpoint Pickers", "tls-to-endpoint-pickers"},
		{"mci's credentials Secret (verified TLS, mutual TLS)", "mcis-credentials-secret-verified-tls-mutual-tls"},
		{"`mci-sidecar` flags", "mci-sidecar-flags"},
		{"Which routes mci-sidecar serves (Gateway API rules)", "which-routes-mci-sidecar-serves-gateway-api-rules"},
		{"[mci-epp](x.md) and snake_case", "mci-epp-and-snake_case"},
		{"Install, then upgrade ##", "install-then-upgrade"},
	} {
		t.Run(tc.heading, func(t *testing.T) {
			assert.Equal(t, tc.slug, headingSlug(tc.heading))
		})
	}
}

func TestRepeatedHeadingsAreNumbered(t *testing.T) {
	got := anchors("# A\n## Flags\n```\n# not a heading\n```\n## Flags\n## Flags\n")
	assert.Equal(t, map[string]bool{"a": true, "flags": true, "flags-1": true, "flags-2": true}, got)
}

// TestRelativeLinksResolve follows every link of README.md and docs/ that
// stays in the repository: the file or directory exists, inside the
// repository, and the #anchor is a heading of the page it names. The docs
// never point outside the repository, where a reader of a clone cannot
// follow.
func TestRelativeLinksResolve(t *testing.T) {
	root, err := filepath.Abs(repoRoot)
	require.NoError(t, err)
	for _, file := range markdownFiles(t) {
		t.Run(file, func(t *testing.T) {
			content := read(t, file)
			assert.False(t, strings.Contains(content, "/work/"), "%s names a path of the machine it was written on", file)
			for _, target := range links(content) {
				if schemeLink.MatchString(target) {
					continue
				}
				checkLink(t, root, file, target)
			}
		})
	}
}

func checkLink(t *testing.T, root, file, target string) {
	t.Helper()
	path, fragment, _ := strings.Cut(target, "#")
	if strings.HasPrefix(path, "/") {
		t.Errorf("%s: link %q is absolute; link relative to the page", file, target)
		return
	}
	resolved := file
	if path != "" {
		resolved = filepath.ToSlash(filepath.Join(filepath.Dir(file), path))
		full := filepath.Join(root, resolved)
		if rel, err := filepath.Rel(root, full); err != nil || strings.HasPrefix(rel, "..") {
			t.Errorf("%s: link %q leaves the repository", file, target)
			return
		}
		if _, err := os.Stat(full); err != nil {
			t.Errorf("%s: link %q: %s does not exist", file, target, resolved)
			return
		}
	}
	if fragment == "" {
		return
	}
	if !strings.HasSuffix(resolved, ".md") {
		t.Errorf("%s: link %q has an anchor into a file that is not markdown", file, target)
		return
	}
	if !anchors(read(t, resolved))[fragment] {
		t.Errorf("%s: link %q: %s has no heading with the anchor #%s", file, target, resolved, fragment)
	}
}

func read(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, rel))
	require.NoError(t, err)
	return string(b)
}
