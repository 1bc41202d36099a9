//! The terminal's progress bar, and the one way lines reach stderr while one is drawn
//! ([`say`]: above the bar, not through it).

/// A terminal progress bar (indicatif) with the `native` feature; without it (the
/// browser) every call does nothing. `Sync`: `compare`'s worker threads share one.
pub(crate) struct Progress {
    #[cfg(feature = "native")]
    bar: indicatif::ProgressBar,
    /// Its number while it is the bar on the terminal (0: hidden).
    #[cfg(feature = "native")]
    shown: u64,
}

/// The bar drawn on the terminal now, with its number: [`say`]'s lines go above it.
#[cfg(feature = "native")]
static SHOWN: std::sync::Mutex<Option<(u64, indicatif::ProgressBar)>> = std::sync::Mutex::new(None);

/// Whether a bar is drawn on the terminal now.
#[cfg(feature = "native")]
pub(super) fn bar_shown() -> bool {
    SHOWN.lock().unwrap_or_else(|e| e.into_inner()).is_some()
}

/// One line on stderr. Where a bar is drawn (a run's; `compare`'s while its runs say they
/// resume or pass over a checkpoint) the line goes above it instead of through it.
pub fn say(line: &str) {
    #[cfg(feature = "native")]
    {
        let shown = SHOWN
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|(_, bar)| bar.clone());
        if let Some(bar) = shown {
            bar.suspend(|| eprintln!("{line}"));
            return;
        }
    }
    eprintln!("{line}");
}

impl Progress {
    /// A bar of `total` with an indicatif `template`, drawn when `show`; hidden otherwise.
    pub(crate) fn new(show: bool, total: u64, template: &str) -> Self {
        #[cfg(feature = "native")]
        {
            static NUMBER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
            if show {
                let bar = indicatif::ProgressBar::new(total);
                bar.set_style(
                    indicatif::ProgressStyle::with_template(template).expect("valid template"),
                );
                let shown = NUMBER.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                *SHOWN.lock().unwrap_or_else(|e| e.into_inner()) = Some((shown, bar.clone()));
                Self { bar, shown }
            } else {
                Self {
                    bar: indicatif::ProgressBar::hidden(),
                    shown: 0,
                }
            }
        }
        #[cfg(not(feature = "native"))]
        {
            let _ = (show, total, template);
            Self {}
        }
    }

    pub(crate) fn set_position(&self, _pos: u64) {
        #[cfg(feature = "native")]
        self.bar.set_position(_pos);
    }

    pub(crate) fn inc(&self, _delta: u64) {
        #[cfg(feature = "native")]
        self.bar.inc(_delta);
    }

    /// The message is built only when a bar can show it.
    pub(crate) fn set_message(&self, _msg: impl FnOnce() -> String) {
        #[cfg(feature = "native")]
        self.bar.set_message(_msg());
    }

    pub(crate) fn set_length(&self, _len: u64) {
        #[cfg(feature = "native")]
        self.bar.set_length(_len);
    }

    pub(crate) fn finish_and_clear(&self) {
        #[cfg(feature = "native")]
        {
            self.unshow();
            self.bar.finish_and_clear();
        }
    }

    /// No longer the bar [`say`] writes above.
    #[cfg(feature = "native")]
    fn unshow(&self) {
        let mut shown = SHOWN.lock().unwrap_or_else(|e| e.into_inner());
        if shown.as_ref().is_some_and(|(n, _)| *n == self.shown) {
            *shown = None;
        }
    }

    /// Redraw a few times a second on its own (the spinner and the elapsed time move) through
    /// long work that makes no step, e.g. a cold start that is one engine call.
    pub(crate) fn tick_steadily(&self, _on: bool) {
        #[cfg(feature = "native")]
        if _on {
            self.bar
                .enable_steady_tick(std::time::Duration::from_millis(250));
        } else {
            self.bar.disable_steady_tick();
        }
    }
}

#[cfg(feature = "native")]
impl Drop for Progress {
    fn drop(&mut self) {
        self.unshow();
    }
}
