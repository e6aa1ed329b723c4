'use strict';
// Word-count topology: sentence spout. Reads the text file PATH (relative to
// the working directory); each non-empty line (surrounding whitespace
// stripped) is emitted once as [sentence] with msg id = its 0-based line index
// in the file. Failed ids are re-queued and emitted again by a later
// nextTuple; acked ids are forgotten. When all is emitted, nextTuple is idle.
// Usage: node examples/node/sentence_spout.js PATH

const fs = require('fs');
const { Spout } = require(require('path').join(__dirname, 'multilang'));

const ASCII_WS = /^[ \t\n\r\f\v]+|[ \t\n\r\f\v]+$/g;

class SentenceSpout extends Spout {
  constructor(file) {
    super();
    this.file = file;
    this.sentences = [];      // [index, sentence] in file order
    this.next = 0;            // position in this.sentences
    this.retry = [];          // failed ids waiting to be emitted again
    this.pending = new Map(); // id -> sentence, emitted and not yet acked
    this.byId = new Map();
  }

  async open() {
    let text;
    try {
      if (!this.file) throw new Error('usage: sentence_spout.js PATH');
      text = await fs.promises.readFile(this.file, 'utf8');
    } catch (e) {
      this.reportError(`sentence_spout: ${e.message}`);
      console.error(`sentence_spout: ${e.message}`);
      process.exit(1);
    }
    text.split('\n').forEach((line, index) => {
      const sentence = line.replace(ASCII_WS, '');
      if (sentence !== '') {
        this.sentences.push([index, sentence]);
        this.byId.set(index, sentence);
      }
    });
  }

  nextTuple() {
    let id;
    if (this.retry.length > 0) id = this.retry.shift();
    else if (this.next < this.sentences.length) id = this.sentences[this.next++][0];
    else return;
    const sentence = this.byId.get(id);
    this.pending.set(id, sentence);
    this.emit([sentence], { msgId: id });
  }

  ack(id) {
    this.pending.delete(id);
  }

  fail(id) {
    if (this.pending.delete(id)) this.retry.push(id);
  }
}

if (require.main === module) new SentenceSpout(process.argv[2]).run();

module.exports = { SentenceSpout };
