#!/bin/sh
# Renders a sample profile report (kiln/profiler/report_html.hpp) in headless Chromium and checks
# the result: the DOM holds the two SVG charts, the page references nothing outside itself, and a
# screenshot shows the phase colours of the stacked bars and the memory chart.
#
# Usage: html_render_test.sh RENDER_REPORT_EXE [WORK_DIR]
# Exits 77 (ctest SKIP_RETURN_CODE) when Chromium or /usr/bin/python3 is missing. Set CHROMIUM to
# use another browser binary.
set -u

render_report=${1:?usage: html_render_test.sh RENDER_REPORT_EXE [WORK_DIR]}
here=$(cd "$(dirname "$0")" && pwd)
header="$here/../../include/kiln/profiler/report_html.hpp"
work=${2:-$(mktemp -d)}
mkdir -p "$work"
html="$work/report.html"
png="$work/report.png"
dom="$work/report.dom.html"

fail() { echo "FAIL: $*" >&2; exit 1; }

browser=${CHROMIUM:-$(command -v chromium || command -v chromium-browser || true)}
if [ -z "$browser" ]; then
  echo "SKIP: chromium is not installed (apt-get install chromium), cannot render the report"
  exit 77
fi
if [ ! -x /usr/bin/python3 ]; then
  echo "SKIP: /usr/bin/python3 is not installed, cannot check the screenshot"
  exit 77
fi

"$render_report" "$html" || fail "render_report could not write $html"
[ -s "$html" ] || fail "$html is empty"

# Offline by construction: no element may load anything (the <svg> needs no xmlns in HTML).
if grep -Eqi '(src|href)=|url\(|@import|<script' "$html"; then
  fail "the report references an external resource or a script:
$(grep -Eoi '.{0,40}((src|href)=|url\(|@import|<script).{0,40}' "$html" | head -5)"
fi

# A fresh profile each run: no state from a previous run or from the user's browser.
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
run_browser() {
  timeout 120 "$browser" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync \
    --disable-dev-shm-usage --force-color-profile=srgb --hide-scrollbars \
    --user-data-dir="$profile" --window-size=1200,1600 "$@" "file://$html"
}

# The DOM as the browser parsed it: both charts must be there as SVG elements, with bars in them.
run_browser --dump-dom > "$dom" 2> "$work/dump-dom.log" || {
  tail -20 "$work/dump-dom.log" >&2; fail "chromium --dump-dom failed"; }
for id in phase-chart memory-chart memory-peak verdict top-ops; do
  grep -q "id=\"$id\"" "$dom" || fail "no element with id=\"$id\" in the rendered DOM ($dom)"
done
grep -q '<svg id="phase-chart"' "$dom" || fail "phase-chart is not an <svg> element"
grep -q '<svg id="memory-chart"' "$dom" || fail "memory-chart is not an <svg> element"
bars=$(grep -o 'class="bar phase-' "$dom" | wc -l)
[ "$bars" -ge 50 ] || fail "expected >= 50 bar segments (10 steps x 5 phases), found $bars"
grep -q '&lt;sample &amp;' "$dom" || fail "the title was not HTML-escaped"

run_browser --screenshot="$png" > "$work/screenshot.log" 2>&1 || {
  tail -20 "$work/screenshot.log" >&2; fail "chromium --screenshot failed"; }
[ -s "$png" ] || fail "chromium wrote no screenshot to $png"

/usr/bin/python3 "$here/check_screenshot.py" --self-test || fail "PNG decoder self-test"
/usr/bin/python3 "$here/check_screenshot.py" "$png" --header "$header" --phases 5 ||
  fail "the screenshot $png does not show the report's charts"
echo "html render test OK ($png)"
