// Client-side navigation, set up by app.js; a module of its own so views need not import the shell.

let handler = (url) => location.assign(url);

export function setNavigator(fn) {
  handler = fn;
}

/** Shows another view without reloading the page. */
export function navigate(url, options = {}) {
  handler(url, options);
}
