#!/usr/bin/env bash
# A local check of the desktop app under a virtual X server (issues 12 and 18): the window
# must survive start-up, 50 resizes and tab switches while the trainer runs, on every device.
# CI does not run this (it needs Xvfb); run it by hand after `cargo build`:
#
#   tests/xvfb_app.sh                  # all devices (cpu, default, software) × both presets
#   DEVICES="cpu" PRESETS="lecture17" RESIZES=10 tests/xvfb_app.sh
#
# Environment: BIN (default target/debug/grpo-lab), DEVICES (cpu default software),
# PRESETS (lecture17 transformer-sort), RESIZES (50), OUT (where logs and screenshots go;
# default a temporary directory). Exits non-zero when any run died, panicked or never
# opened its window. Needs Xvfb, xdotool and xwininfo (installed with apt-get if missing
# and running as root); Mesa's lavapipe for the `software` device.
set -u

cd "$(dirname "$0")/.."
BIN=${BIN:-target/debug/grpo-lab}
DEVICES=${DEVICES:-cpu default software}
PRESETS=${PRESETS:-lecture17 transformer-sort}
RESIZES=${RESIZES:-50}
OUT=${OUT:-$(mktemp -d /tmp/grpo-xvfb.XXXXXX)}
mkdir -p "$OUT"

if [ ! -x "$BIN" ]; then
    echo "no binary at $BIN: run \`cargo build\` first (or set BIN)" >&2
    exit 2
fi

need=()
command -v Xvfb >/dev/null || need+=(xvfb)
command -v xdotool >/dev/null || need+=(xdotool)
command -v xwininfo >/dev/null || need+=(x11-utils)
command -v xwd >/dev/null || need+=(x11-apps)
if [ ${#need[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "installing ${need[*]}…"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null ||
            { echo "could not install ${need[*]}" >&2; exit 2; }
    else
        echo "missing: ${need[*]} (apt-get install -y ${need[*]})" >&2
        exit 2
    fi
fi

# A free display number.
disp=99
while [ -e "/tmp/.X11-unix/X$disp" ] || [ -e "/tmp/.X$disp-lock" ]; do disp=$((disp + 1)); done
Xvfb ":$disp" -screen 0 1600x1000x24 -nolisten tcp >"$OUT/xvfb.log" 2>&1 &
XVFB_PID=$!
APP_PID=
cleanup() {
    [ -n "$APP_PID" ] && kill "$APP_PID" 2>/dev/null
    kill "$XVFB_PID" 2>/dev/null
    wait 2>/dev/null
}
trap cleanup EXIT
export DISPLAY=":$disp"
for _ in $(seq 50); do
    xdpyinfo >/dev/null 2>&1 && break
    sleep 0.1
done
if ! xdpyinfo >/dev/null 2>&1; then
    echo "Xvfb did not start (see $OUT/xvfb.log)" >&2
    exit 2
fi

# Persisted app state (eframe) goes to a scratch directory, not the user's.
export XDG_DATA_HOME="$OUT/xdg-data" XDG_CONFIG_HOME="$OUT/xdg-config" XDG_CACHE_HOME="$OUT/xdg-cache"
unset WAYLAND_DISPLAY

screenshot() { # FILE.png (ImageMagick's `import`, else an .xwd next to it)
    if command -v import >/dev/null; then
        import -window root "$1" 2>/dev/null && return
    fi
    xwd -root -silent -out "${1%.png}.xwd"
}

# Tab labels are clicked at window coordinates measured on a 1600×1000 window (the config
# panel on the left, the tabs row under the controls); TAB_Y overrides the row.
click_tab() { # WINDOW X Y
    xdotool mousemove --window "$1" "$2" "$3" click 1 2>/dev/null
}

failures=0
summary=()
for device in $DEVICES; do
    for preset in $PRESETS; do
        name="$preset-$device"
        log="$OUT/$name.log"
        args=(app --play --preset "$preset")
        [ "$device" != default ] && args+=(--device "$device")
        echo "== $name: $BIN ${args[*]}"
        "$BIN" "${args[@]}" >"$log" 2>&1 &
        APP_PID=$!
        wid=
        for _ in $(seq 600); do # up to 120 s for the window
            kill -0 "$APP_PID" 2>/dev/null || break
            wid=$(xdotool search --onlyvisible --name 'grpo-lab' 2>/dev/null | head -1)
            [ -n "$wid" ] && break
            sleep 0.2
        done
        if [ -z "$wid" ]; then
            echo "   FAIL: no window (alive: $(kill -0 "$APP_PID" 2>/dev/null && echo yes || echo no)); log:"
            tail -20 "$log" | sed 's/^/   | /'
            summary+=("$name: no window")
            failures=$((failures + 1))
            kill "$APP_PID" 2>/dev/null
            wait "$APP_PID" 2>/dev/null
            APP_PID=
            continue
        fi
        xdotool windowmove "$wid" 0 0 2>/dev/null
        sleep 2 # let the trainer start
        done_resizes=0
        tabs=0
        for i in $(seq "$RESIZES"); do
            kill -0 "$APP_PID" 2>/dev/null || break
            w=$((700 + (i * 137) % 800))
            h=$((450 + (i * 89) % 500))
            xdotool windowsize "$wid" "$w" "$h" 2>/dev/null && done_resizes=$((done_resizes + 1))
            sleep 0.15
            if [ $((i % 10)) = 0 ]; then
                # Full screen (the status line fits on one line, so the tabs row is where
                # TAB_Y says), then switch to the next tab (Live plots, Group inspector,
                # Advantage playground, Runs) by clicking its label.
                xdotool windowsize "$wid" 1600 1000 2>/dev/null
                sleep 0.5
                tab_x=(456 555 691 795)
                k=$(((i / 10) % 4))
                click_tab "$wid" "${tab_x[$k]}" "${TAB_Y:-52}" && tabs=$((tabs + 1))
                sleep 0.5
            fi
        done
        sleep 3 # a few more frames (and training steps) after the last resize
        if kill -0 "$APP_PID" 2>/dev/null; then alive=yes; else alive=no; fi
        screenshot "$OUT/$name.png"
        kill "$APP_PID" 2>/dev/null
        wait "$APP_PID" 2>/dev/null
        APP_PID=
        panics=$(grep -c 'panicked' "$log")
        werr=$(grep -c 'window renderer error' "$log")
        line="$name: resizes=$done_resizes tab-clicks=$tabs alive=$alive panics=$panics window-errors=$werr"
        echo "   $line"
        summary+=("$line")
        if [ "$alive" != yes ] || [ "$panics" != 0 ]; then
            failures=$((failures + 1))
            tail -20 "$log" | sed 's/^/   | /'
        fi
    done
done

echo
echo "== summary (logs and screenshots in $OUT)"
printf '%s\n' "${summary[@]}"
if [ "$failures" -gt 0 ]; then
    echo "$failures run(s) failed"
    exit 1
fi
echo "all runs alive"
