//! Files out of the app: written next to the process on the desktop, offered as a download in
//! the browser (a Blob behind a link that is clicked once). One function for both, so every
//! "Save" button (PNG of a plot or of the window, the config as TOML) works in both builds.

/// Deliver `bytes` as a file named `name`; returns where it went (for the status line).
pub fn deliver(name: &str, bytes: &[u8]) -> Result<String, String> {
    #[cfg(not(target_arch = "wasm32"))]
    {
        std::fs::write(name, bytes).map_err(|e| format!("{name}: {e}"))?;
        Ok(format!("saved {name}"))
    }
    #[cfg(target_arch = "wasm32")]
    {
        download(name, bytes).map_err(|e| format!("{name}: download failed ({e:?})"))?;
        Ok(format!("downloaded {name}"))
    }
}

#[cfg(target_arch = "wasm32")]
fn download(name: &str, bytes: &[u8]) -> Result<(), wasm_bindgen::JsValue> {
    use wasm_bindgen::JsCast;
    let parts = js_sys::Array::new();
    parts.push(&js_sys::Uint8Array::from(bytes).into());
    let blob = web_sys::Blob::new_with_u8_array_sequence(&parts)?;
    let url = web_sys::Url::create_object_url_with_blob(&blob)?;
    let document = web_sys::window()
        .and_then(|w| w.document())
        .ok_or("no document")?;
    let a: web_sys::HtmlAnchorElement = document.create_element("a")?.dyn_into()?;
    a.set_href(&url);
    a.set_download(name);
    a.click();
    web_sys::Url::revoke_object_url(&url)
}

/// An RGBA image as PNG bytes.
pub fn png_bytes(image: &egui::ColorImage) -> Result<Vec<u8>, String> {
    use image::ImageEncoder;
    let [w, h] = image.size;
    let rgba: Vec<u8> = image.pixels.iter().flat_map(|c| c.to_array()).collect();
    let mut out = Vec::new();
    image::codecs::png::PngEncoder::new(&mut out)
        .write_image(&rgba, w as u32, h as u32, image::ColorType::Rgba8)
        .map_err(|e| e.to_string())?;
    Ok(out)
}

/// Files dropped on the window (the browser's upload; a drop works on the desktop too), read
/// as text: at once on the desktop, asynchronously in the browser (the only way it can).
#[derive(Clone, Default)]
pub struct Drops(std::sync::Arc<std::sync::Mutex<Vec<Dropped>>>);

/// A dropped file's name and its text (or why it could not be read).
type Dropped = (String, Result<String, String>);

impl Drops {
    fn push(&self, name: String, bytes: Result<Vec<u8>, String>) {
        let text = bytes.and_then(|b| String::from_utf8(b).map_err(|e| e.to_string()));
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((name, text));
    }

    /// Start reading what was dropped this frame.
    pub fn collect(&self, ctx: &egui::Context) {
        for f in ctx.input(|i| i.raw.dropped_files.clone()) {
            let name = f.path().display().to_string();
            #[cfg(not(target_arch = "wasm32"))]
            self.push(name, f.bytes());
            #[cfg(target_arch = "wasm32")]
            {
                let (me, ctx) = (self.clone(), ctx.clone());
                wasm_bindgen_futures::spawn_local(async move {
                    let bytes = f.bytes_async().await;
                    me.push(name, bytes);
                    ctx.request_repaint();
                });
            }
        }
    }

    /// A file read since the last call: its name and text.
    pub fn take(&self) -> Option<(String, Result<String, String>)> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).pop()
    }
}
